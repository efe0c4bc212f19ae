"""study_zeroshot.py on tiny exports with a vocabulary that splits some of the scored words: the prompt, the
first-piece rule, the log-probabilities at [MASK] (batched and padded as one sentence alone), the median threshold."""
from __future__ import annotations

import numpy as np
import pytest
import torch

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "it", "was", ".", "great", "good", "bad", "terr", "##ible",
         "aw", "##ful", "excel", "##lent", "the", "film", "is", "a", "fun", "dull", "plot", "and", "long"]


@pytest.fixture(scope="module")
def zeroshot(study_importable):
    import study_zeroshot
    return study_zeroshot


def _export(path, next_sentence_prediction):
    from model import BertConfig, BertForPreTraining
    from model.bert.hf_files import export_hf

    path.mkdir(parents=True)
    (path.parent / "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    torch.manual_seed(3)
    config = BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_layers=1, num_heads=2, intermediate_size=32,
                        max_position_embeddings=128)
    return export_hf(BertForPreTraining(config, next_sentence_prediction=next_sentence_prediction), path,
                     path.parent / "vocab.txt")


@pytest.fixture(scope="module")
def export(tmp_path_factory):
    return _export(tmp_path_factory.mktemp("zeroshot") / "mlm", next_sentence_prediction=False)


@pytest.fixture(scope="module")
def tokenizer(export):
    from pipeline.finetuning.tokenizer import load_tokenizer
    return load_tokenizer(export, len(VOCAB))


def test_split_words_are_scored_by_their_first_piece(zeroshot, tokenizer):
    words = zeroshot.word_pieces(tokenizer, [*zeroshot.POSITIVE, *zeroshot.NEGATIVE])
    assert [w for w, found in words.items() if found["split"]] == ["excellent", "terrible", "awful"]
    assert words["terrible"]["pieces"] == ["terr", "##ible"]
    assert words["terrible"]["first_id"] == VOCAB.index("terr")
    assert words["great"] == {"pieces": ["great"], "split": False, "first_id": VOCAB.index("great"), "unknown": False}


def test_the_prompt(zeroshot, tokenizer):
    mask = VOCAB.index("[MASK]")
    ids = zeroshot.prompt_ids(tokenizer, ["The film is fun", "dull " * 300], mask)
    assert [VOCAB[i] for i in ids[0]] == ["[CLS]", "the", "film", "is", "fun", "it", "was", "[MASK]", ".", "[SEP]"]
    assert len(ids[1]) == 128 and [VOCAB[i] for i in ids[1][-5:]] == ["it", "was", "[MASK]", ".", "[SEP]"]


def test_log_probabilities_at_the_mask_are_those_of_each_sentence_alone(zeroshot, tokenizer, export):
    from pipeline.core.checkpoints.weights import load_pretraining_model

    model = load_pretraining_model(export).eval()
    mask = VOCAB.index("[MASK]")
    sequences = zeroshot.prompt_ids(tokenizer, ["a fun film", "the plot is long and dull and the film is bad"], mask)
    batched = zeroshot.mask_log_probs(model, sequences, tokenizer.pad_id, mask)
    for row, ids in enumerate(sequences):
        with torch.no_grad():
            logits = model(torch.tensor([ids])).mlm_logits[0, ids.index(mask)]     # every position, no padding
        assert torch.allclose(batched[row], torch.log_softmax(logits, dim=-1), atol=1e-5)
    scores = zeroshot.scores(batched, [8, 9], [10, 11])
    expected = (batched[:, [8, 9]].mean(1) - batched[:, [10, 11]].mean(1)).numpy()
    assert np.allclose(scores, expected)


def test_a_sentence_is_positive_above_the_median(zeroshot):
    assert zeroshot.median_calls(np.array([0.3, -1.0, 2.0, 0.1])).tolist() == [1, 0, 1, 0]
    assert zeroshot.median_calls(np.array([0.5, 0.5, 0.5])).tolist() == [0, 0, 0]   # ties are not above it


@pytest.mark.parametrize("nsp", [False, True])
def test_zero_shot_end_to_end(zeroshot, tmp_path, export, nsp):
    from pipeline.core.checkpoints.weights import load_pretraining_model

    path = _export(tmp_path / "nsp", True) if nsp else export
    texts = ["a fun film", "the plot is dull", "a long film", "the film is bad", "fun and great", "dull and long"]
    labels = [1, 0, 0, 0, 1, 0]
    found = zeroshot.zero_shot_sst2(path, texts, labels)
    assert found["objective"] == ("mlm_nsp" if nsp else "mlm")
    assert found["split_words"] == ["excellent", "terrible", "awful"]
    # the same numbers by hand, from the pieces' ids
    mask = VOCAB.index("[MASK]")
    from pipeline.finetuning.tokenizer import load_tokenizer

    tokenizer = load_tokenizer(path, len(VOCAB))
    log_probs = zeroshot.mask_log_probs(load_pretraining_model(path).eval(),
                                        zeroshot.prompt_ids(tokenizer, texts, mask), tokenizer.pad_id, mask)
    positive = [VOCAB.index(w) for w in ("great", "good", "excel")]
    negative = [VOCAB.index(w) for w in ("terr", "bad", "aw")]
    values = (log_probs[:, positive].mean(1) - log_probs[:, negative].mean(1)).numpy()
    calls = values > np.median(values)
    assert found["median"] == pytest.approx(float(np.median(values)), abs=1e-6)
    assert found["called_positive"] == int(calls.sum()) == 3
    assert found["accuracy"] == pytest.approx(float(np.mean(calls == np.array(labels))))
