"""The losses of the pre-training and task heads of both architectures: cross-entropy with a lean backward and the
counts for accuracies, regression, multiple choice, and answer spans. In fp32 under autocast; a batch with nothing
to count gives 0, not NaN."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd.function import once_differentiable

from model.shared.outputs import IGNORE_INDEX


class _SummedCrossEntropy(torch.autograd.Function):
    """F.cross_entropy(logits, labels, ignore_index=IGNORE_INDEX, reduction="sum"), with a leaner backward.

    logits (N, K), labels (N,). The backward turns the log-probabilities saved by the forward into
    softmax - one_hot in place, where autograd's would allocate two more (N, K) tensors (nll_loss's zero-filled
    gradient and log_softmax's backward output): for the MLM head, (B * P, 30522) fp32 is 78 MB apiece. Having
    been overwritten, the saved tensor cannot serve a second backward; autograd refuses one (as it does any
    use of a saved tensor changed in place).
    """

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        log_probs = torch.log_softmax(logits, dim=-1)  # (N, K)
        counted = labels != IGNORE_INDEX  # (N,)
        labels = labels.masked_fill(~counted, 0)  # any valid class; these rows are weighted 0
        picked = log_probs.gather(1, labels[:, None]).squeeze(1)  # (N,)
        ctx.save_for_backward(log_probs, labels, counted)
        return -picked.masked_fill(~counted, 0.0).sum()

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss: torch.Tensor):
        log_probs, labels, counted = ctx.saved_tensors
        grad = log_probs.exp_()  # softmax, (N, K)
        rows = torch.arange(grad.shape[0], device=grad.device)
        # -1 at each row's label, made on the device (a fill): torch.tensor(-1.0, device=...) would be a host-to-device
        # copy, which on a GPU waits for all the work queued before it, in every backward.
        grad.index_put_((rows, labels), grad.new_full((), -1.0), accumulate=True)
        grad.mul_(counted.to(grad.dtype).mul_(grad_loss)[:, None])  # d loss / d logits = g * (softmax - one_hot)
        return grad, None


def classification_loss(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Mean cross-entropy over labels != IGNORE_INDEX, with the number right and the number counted.

    Computed in fp32 (bf16 log-softmax over 30k classes is coarse). Unlike F.cross_entropy's mean, a batch with
    no labels at all gives a loss of 0, not NaN.
    """
    logits = logits.reshape(-1, logits.shape[-1]).float()  # (N, classes)
    labels = labels.reshape(-1).long()  # (N,)
    counted = labels != IGNORE_INDEX
    total = counted.sum()
    loss = _SummedCrossEntropy.apply(logits, labels) / total.clamp(min=1)
    correct = ((logits.argmax(dim=-1) == labels) & counted).sum()
    return loss, correct, total


def regression_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean squared error of (B, 1) predictions against (B,) targets (transformers' problem_type "regression")."""
    # Flattened, not squeezed: a (B,) minus (B, 1) would broadcast to (B, B) without complaint.
    return F.mse_loss(logits.float().reshape(-1), labels.float().reshape(-1))


def choice_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (B, classes) logits against (B,) class ids; computed in fp32 under autocast."""
    return F.cross_entropy(logits.float(), labels.long())


def mean_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """F.cross_entropy's mean of (..., classes) logits against (...) labels, over the labels != ignore_index.

    In fp32 under autocast. Where none is counted the loss is 0, not F.cross_entropy's (and transformers') NaN 0/0:
    such a batch has nothing to learn, and one NaN would end the run.
    """
    logits = logits.reshape(-1, logits.shape[-1]).float()  # (N, classes)
    labels = labels.reshape(-1).long()  # (N,)
    summed = F.cross_entropy(logits, labels, ignore_index=ignore_index, reduction="sum")
    return summed / (labels != ignore_index).sum().clamp(min=1)


def span_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """transformers' BertForQuestionAnswering loss: the mean of the start and the end cross-entropies over the T
    positions. logits (B, T, 2); labels (B, 2) the start and end token positions.

    Positions are clamped to [0, T] and T is ignored: an answer beyond the sequence takes no part, and a
    negative position counts as 0 ([CLS]), as in transformers. Start and end are averaged separately, so a row
    whose end alone is ignored still trains its start.
    """
    B, T, _ = logits.shape
    if labels.shape != (B, 2):
        raise ValueError(f"span labels must be (B, 2) = {(B, 2)} start and end positions, got {tuple(labels.shape)}")
    positions = labels.long().clamp(0, T)  # (B, 2)
    start = mean_cross_entropy(logits[..., 0], positions[:, 0], ignore_index=T)
    end = mean_cross_entropy(logits[..., 1], positions[:, 1], ignore_index=T)
    return (start + end) / 2
