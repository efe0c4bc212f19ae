"""FLOPs of a BERT training step and model FLOPs utilisation (MFU): what the throughput callback reports."""
from __future__ import annotations

from model.bert.config import BertConfig
from model.modernbert.config import ModernBertConfig


def flops_per_token(config: BertConfig | ModernBertConfig, seq_len: int, num_masked_per_seq: int) -> float:
    """Model FLOPs per token of one training step (forward + backward) of BertForPreTraining, or of
    ModernBertForMaskedLM for a ModernBertConfig (modernbert_flops_per_token).

    Counts matrix multiplications only (as PaLM's MFU, Chowdhery et al. 2022, appendix B): a multiply-add is 2
    FLOPs, and the backward pass costs twice the forward, hence 6 FLOPs per weight per token it touches.
    - encoder: num_layers * (4 C^2 + 2 C F) weights (qkv, attention output, MLP), applied at all T positions;
    - attention scores and their weighted sum: 2 T C multiply-adds per token per layer, so 12 * L * C * T;
    - MLM head: transform C^2 + decoder C V, applied at P of T positions only (the gather above);
    - pooler C^2 + NSP 2 C, applied once per sequence.
    Embedding lookups, LayerNorm, softmax and GELU are left out. seq_len is the padded length the batch is run
    at and tokens counted per second must include padding (B * T per step), since padding costs the same.
    MFU = flops_per_token * tokens_per_second / peak_flops; see mfu().
    """
    if isinstance(config, ModernBertConfig):
        return modernbert_flops_per_token(config, seq_len, num_masked_per_seq)
    # C: hidden width, F: the MLP's (feed-forward) width, V: vocabulary, L: layers, T: positions
    C, F, V, L, T = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_layers, seq_len
    encoder_weights = L * (4 * C * C + 2 * C * F)
    mlm_head_weights_per_token = (C * C + C * V) * num_masked_per_seq / T
    nsp_weights_per_token = (C * C + 2 * C) / T
    attention = 12 * L * C * T
    return 6 * (encoder_weights + mlm_head_weights_per_token + nsp_weights_per_token) + attention


def dense_flops_per_token(config: BertConfig | ModernBertConfig) -> float:
    """The encoder layers' weight FLOPs per token of a training step, the part of flops_per_token that data.unpad
    computes on the real tokens only (the attention scores stay on the padded rows): BERT's 4 C^2 + 2 C F weights a
    layer, ModernBERT's 4 C^2 + 3 C F, at 6 FLOPs each."""
    C, F, L = config.hidden_size, config.intermediate_size, config.num_layers
    return 6 * L * (4 * C * C + (3 if isinstance(config, ModernBertConfig) else 2) * C * F)


def batch_flops(config: BertConfig | ModernBertConfig, batch_size: int, seq_len: int, num_masked_per_seq: int,
                computed_tokens: int | None = None) -> float:
    """Model FLOPs of one micro-batch of B rows of T positions: flops_per_token x B x T, less, for an unpadded batch
    (data.unpad: its encoder layers computed on `computed_tokens` real tokens, not B x T), the dense FLOPs of the
    padding it never computed. From shapes only: no value is read."""
    flops = flops_per_token(config, seq_len, num_masked_per_seq) * batch_size * seq_len
    if computed_tokens is not None:
        flops -= dense_flops_per_token(config) * (batch_size * seq_len - computed_tokens)
    return flops


def modernbert_flops_per_token(config: ModernBertConfig, seq_len: int, num_masked_per_seq: int) -> float:
    """flops_per_token for ModernBertForMaskedLM, counted the same way, with its differences from BERT:
    - encoder: num_layers * (4 C^2 + 3 C F) weights: Wqkv and Wo as BERT's, and the GeGLU MLP's Wi (C -> 2F) and
      Wo (F -> C);
    - attention scores and weighted sum: 12 * C * keys per token per layer, where a global layer's query has T keys
      and a local layer's at most local_attention + 1 (its window, itself included). This counts what the sliding
      window needs, not what a dense masked kernel (SDPA with a mask) spends on the masked-out keys;
    - MLM head: transform C^2 + decoder C V at P of T positions; no pooler, no next-sentence head.
    Packed documents attend within themselves only, which this leaves out too: T is the padded row length.
    """
    C, F, V, L, T = config.hidden_size, config.intermediate_size, config.vocab_size, config.num_layers, seq_len
    encoder_weights = L * (4 * C * C + 3 * C * F)
    mlm_head_weights_per_token = (C * C + C * V) * num_masked_per_seq / T
    num_global = sum(config.layer_is_global(i) for i in range(L))
    keys = num_global * T + (L - num_global) * min(T, config.local_attention + 1)
    attention = 12 * C * keys
    return 6 * (encoder_weights + mlm_head_weights_per_token) + attention


# Dense (no 2:4 sparsity) tensor-core peaks in FLOP/s for bf16 (fp16 on V100, which has no bf16), per GPU,
# from NVIDIA's datasheets (which quote sparse figures at twice these).
# Not lightning_fabric.utilities.throughput.get_available_flops (checked in Lightning 2.6.6), though it agrees on the
# H100 SXM (989.4e12), the H100 PCIe and the A100: torch names the H200 SXM "NVIDIA H200", which its parser does not
# recognise (it looks for "sxm1" / "nvl1" and returns None), and its H200 and H100 NVL bf16 entries (2.0e15,
# 1978.8e12) are the with-sparsity figures, twice the dense peak; it has no A10, no bf16 for the V100, and 125e12
# for the A10G. benchmarks/gpu_check.py prints both figures for the GPU it runs on.
PEAK_FLOPS: dict[str, float] = {
    "v100": 125e12,       # V100 SXM2 fp16 (the PCIe card: 112e12); V100 datasheet
    "a100": 312e12,       # A100 SXM4 and PCIe, 40 and 80 GB; A100 datasheet
    "a10": 125e12,        # A10 datasheet (GA102, 72 SMs)
    # AWS's A10G variant: NVIDIA publishes no datasheet; the spec comparison most often cited gives 70 TFLOPS
    # fp16 tensor (Baseten, "NVIDIA A10 vs A10G for ML model inference") - not 125, the A10's figure.
    "a10g": 70e12,
    "h100-sxm": 989e12,   # H100 SXM5; H100 datasheet (989.4; 1,979 with sparsity)
    "h100-pcie": 756e12,  # H100 PCIe; H100 datasheet (1,513 with sparsity)
    "h200": 989e12,       # H200 SXM, the same GH100 compute as the H100 SXM; H200 datasheet
}


# FP8 (e4m3/e5m2) dense tensor-core peak over the dense bf16 one: 2 on every NVIDIA part with FP8 (datasheets, dense:
# H100 SXM 1,979 against 989 TFLOP/s, H100 PCIe 1,513 against 756, H200 1,979 against 989, L4 242 against 121, L40S
# 733 against 362, B200 4,500 against 2,250). An FP8 run's MFU is against that peak (the precision its matmuls ran
# in); its bf16-equivalent MFU, the same FLOPs against the bf16 peak, is twice as large (issue 48, item 5).
FP8_OVER_BF16 = 2.0


def peak_flops_for_device(device_name: str) -> float | None:
    """Peak bf16 FLOP/s for a torch.cuda.get_device_name() string, or None for an unknown GPU."""
    name = device_name.lower()
    if "nvl" in name:
        return None  # the H100 / H200 NVL cards run at lower clocks than the SXM parts; not in the table
    rules = [("h200", "h200"), ("h100 pcie", "h100-pcie"), ("h100", "h100-sxm"), ("a100", "a100"),
             ("a10g", "a10g"), ("a10", "a10"), ("v100", "v100")]
    for needle, key in rules:
        if needle in name:
            return PEAK_FLOPS[key]
    return None


def mfu(config: BertConfig | ModernBertConfig, seq_len: int, num_masked_per_seq: int, tokens_per_second: float,
        peak_flops: float | str, num_gpus: int = 1) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the hardware's peak, as a fraction.

    tokens_per_second: padded tokens (B * T) processed per second by all num_gpus together.
    peak_flops: FLOP/s of one GPU, or a key of PEAK_FLOPS.
    """
    if isinstance(peak_flops, str):
        if peak_flops not in PEAK_FLOPS:
            raise ValueError(f"unknown GPU {peak_flops!r}; known: {', '.join(PEAK_FLOPS)} (or pass FLOP/s)")
        peak_flops = PEAK_FLOPS[peak_flops]
    return flops_per_token(config, seq_len, num_masked_per_seq) * tokens_per_second / (peak_flops * num_gpus)
