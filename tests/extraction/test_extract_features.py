"""Feature extraction: the vectors equal transformers' for the same weights, padding never leaks into them, the
outputs keep the input order and round-trip, and every odd input line gets a counted outcome."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import json  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from pipeline.extraction.extractor import Extractor  # noqa: E402
from pipeline.extraction.inputs import InputReport, TextRecord, read_records  # noqa: E402
from pipeline.extraction.writers import read_reference_jsonl  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[2]
VOCAB = REPO_ROOT / "data_prep" / "vocab" / "bert-base-uncased-vocab.txt"
SENTENCES = ["the movie was wonderful .", "a dull , lifeless and overlong film that nobody should sit through",
             "ok", "who knew ? ||| nobody did , not even the director himself"]


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory) -> Path:
    """A four-layer BERT (tiny's width) at random weights (seeded) as a Hugging Face directory, with the uncased
    vocabulary."""
    from model import BertConfig, BertForPreTraining
    from model.bert.hf_files import export_hf

    torch.manual_seed(0)
    config = BertConfig.from_preset("tiny", num_layers=4)
    return export_hf(BertForPreTraining(config), tmp_path_factory.mktemp("weights") / "hf", VOCAB)


def records(texts: list[str]) -> list[TextRecord]:
    out = []
    for i, text in enumerate(texts):
        a, _, b = text.partition(" ||| ")
        out.append(TextRecord(i, a, b or None))
    return out


def test_every_layer_equals_transformers_bert_model(hf_dir):
    transformers = pytest.importorskip("transformers")
    extractor = Extractor.from_init(hf_dir, layers=None, batch_size=3)   # every hidden state, batches of mixed length
    reference = transformers.BertModel.from_pretrained(hf_dir).eval()
    for sentence in extractor.extract(records(SENTENCES)):
        ids = torch.tensor([sentence.input_ids])
        with torch.no_grad():
            theirs = reference(input_ids=ids, token_type_ids=torch.tensor([sentence.token_type_ids]),
                               output_hidden_states=True).hidden_states
        assert len(theirs) == 5
        for position, state in enumerate(theirs):
            torch.testing.assert_close(torch.from_numpy(sentence.per_token[f"layer_{position}"]), state[0],
                                       atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(torch.from_numpy(sentence.pooled["mean"][f"layer_{position}"]),
                                       state[0].mean(dim=0), atol=1e-5, rtol=1e-5)
            torch.testing.assert_close(torch.from_numpy(sentence.pooled["cls"][f"layer_{position}"]), state[0, 0],
                                       atol=1e-5, rtol=1e-5)


def test_pair_lines_get_segment_b(hf_dir):
    extractor = Extractor.from_init(hf_dir, layers=[-1])
    pair = list(extractor.extract(records(SENTENCES)))[3]
    assert pair.text_b == "nobody did , not even the director himself"
    tokens = extractor.tokens(pair.input_ids)
    assert tokens[0] == "[CLS]" and tokens.count("[SEP]") == 2
    assert pair.token_type_ids[tokens.index("[SEP]") + 1] == 1


def test_pooled_vectors_are_the_same_alone_and_in_a_padded_batch(hf_dir):
    extractor = Extractor.from_init(hf_dir, layers=[-1, 0], combinations=["sum_all", "concat_last_four"],
                                    batch_size=8)
    together = list(extractor.extract(records(SENTENCES)))
    for i, text in enumerate(SENTENCES):
        alone = next(extractor.extract(records([text])))
        for pooling in ("cls", "mean"):
            for view, vector in alone.pooled[pooling].items():
                np.testing.assert_allclose(together[i].pooled[pooling][view], vector, atol=1e-5, rtol=1e-5)
        assert together[i].per_token["layer_-1"].shape == alone.per_token["layer_-1"].shape


def test_combinations_are_built_from_the_layers(hf_dir):
    extractor = Extractor.from_init(hf_dir, layers=None, combinations=["sum_all", "concat_last_four",
                                                                       "second_to_last", "embeddings"])
    sentence = next(extractor.extract(records(SENTENCES[:1])))
    tokens = sentence.per_token
    layers = [tokens[f"layer_{i}"] for i in range(5)]
    np.testing.assert_allclose(tokens["sum_all"], layers[1] + layers[2] + layers[3] + layers[4], atol=1e-5)
    np.testing.assert_array_equal(tokens["concat_last_four"], np.concatenate(layers[:0:-1], axis=1))  # last first
    np.testing.assert_array_equal(tokens["second_to_last"], layers[3])
    np.testing.assert_array_equal(tokens["embeddings"], tokens["layer_0"])


def test_a_layer_the_model_lacks_is_refused(hf_dir):
    with pytest.raises(ValueError, match="layer 5 does not exist in a model with 4 layers"):
        Extractor.from_init(hf_dir, layers=[5])
    with pytest.raises(ValueError, match="unknown layer combination 'sum_first_four'"):
        Extractor.from_init(hf_dir, layers=[], combinations=["sum_first_four"])


# ----------------------------------------------------------------------------------------------------------
# the entry point: inputs, outputs, outcomes

def run_cli(hf_dir: Path, input_file: Path, out: Path, *overrides: str) -> dict:
    from pipeline.core.app import compose
    from pipeline.extraction.run import extract_features

    return extract_features(compose("extract_features", [f"init={hf_dir}", f"input={input_file}", f"output_dir={out}",
                                            "progress=false", "max_seq_length=16", "chunk_size=3",
                                            "batch_size=2", *overrides]))


@pytest.fixture
def awkward_input(tmp_path) -> Path:
    """Good lines around an empty line, an over-long line and a line that is not UTF-8 (cp1252 bytes)."""
    lines = [b"the first line .", b"", b"   ", " ".join(["word"] * 40).encode(), "caf\u00e9 au lait".encode("cp1252"),
             b"short ||| and a second sentence", b"the last line ."]
    path = tmp_path / "input.txt"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def test_odd_lines_get_clear_counted_outcomes_and_rows_keep_input_order(hf_dir, awkward_input, tmp_path):
    import pyarrow.parquet as pq

    summary = run_cli(hf_dir, awkward_input, tmp_path / "run")
    counts = summary["counts"]
    assert counts["empty"] == 2 and summary["first_indices"]["empty"] == [1, 2]
    assert counts["repaired"] == 1 and summary["first_indices"]["repaired"] == [4]
    assert counts["truncated"] == 1 and summary["first_indices"]["truncated"] == [3]
    assert counts["tokens_cut"] == 40 - 14
    assert counts["extracted"] == summary["sentences"] == 5
    assert json.loads((tmp_path / "run" / "report.json").read_text())["counts"] == counts

    table = pq.read_table(summary["output"]).to_pydict()
    assert table["line_index"] == [0, 3, 4, 5, 6]   # input order across chunks of 3; skipped lines leave gaps
    assert table["text_a"][2] == "caf\u00e9 au lait" and table["text_b"][3] == "and a second sentence"
    assert table["tokens"][2][:3] == ["[CLS]", "cafe", "au"]   # the repaired é, lower-cased and stripped of its accent
    assert len(table["tokens"][1]) == 16 and len(table["tokens_layer_-1"][1]) == 16
    assert len(table["mean_layer_-4"][0]) == 128


def test_numpy_output_matches_parquet(hf_dir, awkward_input, tmp_path):
    import pyarrow.parquet as pq

    parquet = pq.read_table(run_cli(hf_dir, awkward_input, tmp_path / "pq", "layers=[-1]")["output"]).to_pydict()
    directory = Path(run_cli(hf_dir, awkward_input, tmp_path / "np", "layers=[-1]", "output_format=numpy")["output"])
    np.testing.assert_array_equal(np.load(directory / "line_index.npy"), parquet["line_index"])
    np.testing.assert_array_equal(np.load(directory / "cls_layer_-1.npy"), np.array(parquet["cls_layer_-1"],
                                                                                     dtype=np.float32))
    offsets = np.load(directory / "token_offsets.npy")
    vectors = np.load(directory / "tokens_layer_-1.npy")
    tokens = (directory / "tokens.txt").read_text(encoding="utf-8").splitlines()
    for i, sentence_tokens in enumerate(parquet["tokens"]):
        assert tokens[offsets[i]:offsets[i + 1]] == sentence_tokens
        np.testing.assert_array_equal(vectors[offsets[i]:offsets[i + 1]],
                                      np.array(parquet["tokens_layer_-1"][i], dtype=np.float32))


def test_reference_jsonl_layout_round_trips(hf_dir, awkward_input, tmp_path):
    import pyarrow.parquet as pq

    parquet = pq.read_table(run_cli(hf_dir, awkward_input, tmp_path / "pq", "layers=[-1,-2]")["output"]).to_pydict()
    path = run_cli(hf_dir, awkward_input, tmp_path / "js", "layers=[-1,-2]", "output_format=jsonl")["output"]
    first = json.loads(Path(path).read_text(encoding="utf-8").splitlines()[0])
    assert set(first) == {"linex_index", "features"}   # the reference's keys, its spelling included
    assert set(first["features"][0]) == {"token", "layers"}
    assert [layer["index"] for layer in first["features"][0]["layers"]] == [-1, -2]
    back = list(read_reference_jsonl(path))
    assert [r["line_index"] for r in back] == parquet["line_index"]
    for record, tokens, last, second in zip(back, parquet["tokens"], parquet["tokens_layer_-1"],
                                            parquet["tokens_layer_-2"]):
        assert record["tokens"] == tokens
        np.testing.assert_allclose(record["layers"][-1], np.array(last, dtype=np.float32), atol=5e-7)
        np.testing.assert_allclose(record["layers"][-2], np.array(second, dtype=np.float32), atol=5e-7)


def test_jsonl_output_refuses_combinations(hf_dir, awkward_input, tmp_path):
    with pytest.raises(ValueError, match="single layers only"):
        run_cli(hf_dir, awkward_input, tmp_path / "js", "combinations=[sum_all]", "output_format=jsonl")


@pytest.mark.parametrize("fmt", ["csv", "tsv", "parquet", "jsonl"])
def test_a_column_of_a_table_is_read_in_order_with_pairs(tmp_path, fmt):
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [{"sentence": "first one", "other": "b1", "label": 0}, {"sentence": "", "other": "b2", "label": 1},
            {"sentence": "third", "other": "b3", "label": 1}]
    path = tmp_path / f"input.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    elif fmt == "jsonl":
        path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{not json\n", encoding="utf-8")
    else:
        sep = "\t" if fmt == "tsv" else ","
        path.write_text("\n".join([sep.join(rows[0])] + [sep.join(str(v) for v in r.values()) for r in rows]) + "\n",
                        encoding="utf-8")
    report = InputReport()
    read = list(read_records(path, report, column="sentence", column_b="other"))
    assert [(r.index, r.text_a, r.text_b) for r in read] == [(0, "first one", "b1"), (2, "third", "b3")]
    assert report.counts["empty"] == 1 and report.counts["extracted"] == 2   # B alone is no input
    if fmt == "jsonl":
        assert report.counts["bad_record"] == 1


def test_a_missing_column_is_named(tmp_path):
    path = tmp_path / "in.tsv"
    path.write_text("sentence\tlabel\nhello\t1\n", encoding="utf-8")
    with pytest.raises(ValueError, match="no column text; its columns: sentence, label"):
        list(read_records(path, InputReport(), column="text"))
    with pytest.raises(ValueError, match="needs column="):
        list(read_records(path, InputReport()))
