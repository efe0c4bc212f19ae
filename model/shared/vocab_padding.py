"""The MLM decoder's matmul over a vocabulary padded to an aligned width (model.pad_vocab_to_multiple_of)."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def padded_vocab_linear(hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, multiple: int) -> torch.Tensor:
    """The decoder's (..., V) logits from a matmul over the vocabulary padded with zero rows to a multiple of
    `multiple`: BERT's 30,522 is no multiple of 8, and a bf16 GEMM whose output rows are 30,522 wide misses the
    tensor cores' aligned kernels (MLPerf's BERT pads to 30,528). The parameters keep their V rows (checkpoints and
    exports unchanged); the padded copy is made in the step (fused with autocast's cast under model.compile) and the
    padding's columns are sliced off, a view whose rows keep the aligned stride. The same logits, to rounding."""
    pad = -weight.shape[0] % multiple
    if pad == 0:
        return F.linear(hidden, weight, bias)
    logits = F.linear(hidden, F.pad(weight, (0, 0, 0, pad)), F.pad(bias, (0, pad)))
    return logits[..., :weight.shape[0]]
