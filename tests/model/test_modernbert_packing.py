"""Packed rows: several documents in a row attend only within themselves, so each document's outputs are what
transformers gives for that document alone, through both attention paths, padded or unpadded."""
import pytest
import torch

pytest.importorskip("transformers")

from model.modernbert import ModernBertModel  # noqa: E402
from model.modernbert.attention_masks import sdpa_masks, token_documents  # noqa: E402
from tests.model.modernbert_common import (  # noqa: E402
    ATOL,
    CONFIG,
    FLEX_WARNING,
    VOCAB,
    hf_model,
    max_abs_diff,
    packed_batch,
    with_backend,
)

pytestmark = pytest.mark.filterwarnings(FLEX_WARNING)
PATHS = [("sdpa", False), ("sdpa", True), ("flex", False), ("flex", True)]  # (backend, unpadded)


def encode(encoder, batch: dict, unpadded: bool) -> torch.Tensor:
    with torch.no_grad():
        return encoder(batch["input_ids"], batch["attention_mask"], document_ids=batch["document_ids"],
                       position_ids=batch["position_ids"],
                       token_index=batch["token_index"] if unpadded else None).sequence_output  # (B, T, C)


def document_spans(batch: dict):
    """(row, start, end) of every document."""
    for b, lengths in enumerate(batch["documents_per_row"]):
        start = 0
        for n in lengths:
            yield b, start, start + n
            start += n


@pytest.fixture(scope="module")
def hf_and_encoders():
    hf = hf_model("ModernBertModel")
    encoders = {}
    for backend in ("sdpa", "flex"):
        encoders[backend] = ModernBertModel(with_backend(CONFIG, backend)).eval()
        encoders[backend].load_state_dict(hf.state_dict(), strict=True)
    return hf, encoders


@pytest.mark.parametrize("backend,unpadded", PATHS)
def test_each_document_as_transformers_gives_it_alone(hf_and_encoders, backend, unpadded):
    hf, encoders = hf_and_encoders
    batch = packed_batch()
    assert max(end - start for _, start, end in document_spans(batch)) > 2 * CONFIG.local_attention
    packed = encode(encoders[backend], batch, unpadded)
    diffs = []
    for b, start, end in document_spans(batch):
        with torch.no_grad():
            alone = hf(input_ids=batch["input_ids"][b:b + 1, start:end]).last_hidden_state[0]  # (n, C)
        diffs.append(max_abs_diff(packed[b, start:end], alone))
    print(f"\n{backend} unpadded={unpadded}: max abs diff per document {diffs}")
    assert max(diffs) <= ATOL


@pytest.mark.parametrize("backend,unpadded", PATHS)
def test_other_documents_do_not_leak(hf_and_encoders, backend, unpadded):
    """Replacing the second document of row 0 leaves the first one's states exactly as they were."""
    _, encoders = hf_and_encoders
    batch = packed_batch()
    changed = {**batch, "input_ids": batch["input_ids"].clone()}
    b, start, end = list(document_spans(batch))[1]
    assert b == 0
    changed["input_ids"][0, start + 1:end - 1] = torch.randint(5, VOCAB, (end - start - 2,),
                                                               generator=torch.Generator().manual_seed(9))
    before, after = encode(encoders[backend], batch, unpadded), encode(encoders[backend], changed, unpadded)
    assert max_abs_diff(before[0, :start], after[0, :start]) <= 1e-6
    assert max_abs_diff(before[0, start:end], after[0, start:end]) > 100 * ATOL  # the change did reach its own
    assert max_abs_diff(before[1:], after[1:]) <= 1e-6  # nor other rows


def test_paths_agree_on_packed_rows(hf_and_encoders):
    _, encoders = hf_and_encoders
    batch = packed_batch()
    real = batch["attention_mask"].bool()
    reference = encode(encoders["sdpa"], batch, unpadded=False)
    for backend, unpadded in PATHS[1:]:
        assert max_abs_diff(encode(encoders[backend], batch, unpadded)[real], reference[real]) <= ATOL, backend


def test_running_positions_equal_restarting_ones(hf_and_encoders):
    """Rotary attention depends on relative positions only: a row's positions running on across documents give the
    same outputs (to float rounding) as positions restarting at each document."""
    _, encoders = hf_and_encoders
    batch = packed_batch()
    real = batch["attention_mask"].bool()
    running = {**batch, "position_ids": torch.arange(batch["input_ids"].shape[1]).expand_as(batch["input_ids"])}
    assert max_abs_diff(encode(encoders["sdpa"], running, False)[real],
                        encode(encoders["sdpa"], batch, False)[real]) <= 1e-4


def test_dense_masks():
    """The rule on a small case: two documents and padding, window 1 on each side; padding attends to itself."""
    documents = token_documents(torch.tensor([[1, 1, 1, 1, 0]]), torch.tensor([[0, 0, 0, 1, -1]]))
    assert documents.tolist() == [[0, 0, 0, 1, -1]]
    global_mask, local_mask = sdpa_masks(documents, 5, 1, torch.device("cpu"))
    assert global_mask.shape == local_mask.shape == (1, 1, 5, 5)
    assert global_mask[0, 0].int().tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [1, 1, 1, 0, 0],
                                                [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    assert local_mask[0, 0].int().tolist() == [[1, 1, 0, 0, 0], [1, 1, 1, 0, 0], [0, 1, 1, 0, 0],
                                               [0, 0, 0, 1, 0], [0, 0, 0, 0, 1]]
    # without padding or documents: no mask on global layers, and none on local ones where the window covers the row
    assert sdpa_masks(None, 5, 4, torch.device("cpu")) == (None, None)
    global_mask, local_mask = sdpa_masks(None, 5, 3, torch.device("cpu"))
    assert global_mask is None and local_mask.shape == (1, 1, 5, 5) and not local_mask[0, 0, 0, 4]


def test_paths_agree_on_gradients(hf_and_encoders):
    """A training step's gradients, padded and unpadded, are the same. flex has no CPU backward in torch 2.13: there
    it refuses to train, with a message saying what to use."""
    _, encoders = hf_and_encoders
    batch = packed_batch()
    real = batch["attention_mask"].bool()
    with pytest.raises(NotImplementedError, match="cannot train on the CPU"):
        encoders["flex"](batch["input_ids"], batch["attention_mask"], document_ids=batch["document_ids"])
    grads = {}
    for backend, unpadded in PATHS[:2]:  # sdpa, padded and unpadded
        encoder = encoders[backend]
        encoder.zero_grad()
        out = encoder(batch["input_ids"], batch["attention_mask"], document_ids=batch["document_ids"],
                      position_ids=batch["position_ids"], token_index=batch["token_index"] if unpadded else None)
        out.sequence_output[real].square().mean().backward()
        grads[backend, unpadded] = {name: p.grad.clone() for name, p in encoder.named_parameters()}
        encoder.zero_grad()
    reference = grads["sdpa", False]
    for path, grad in grads.items():
        for name, tensor in grad.items():
            assert max_abs_diff(tensor, reference[name]) <= ATOL, (path, name)
