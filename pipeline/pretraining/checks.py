"""Everything a pre-training run checks before it starts: the model, the batch arithmetic for its devices, the
schedule, the strategy with the optimizer, the checkpoint to resume or start from, the loggers, the shard set
against the model, and a resume's config against the run's record (pipeline/core/run/run_record.py: what shapes the run
may change only when the resume accepts it, resume.accept_changes). A wrong setting stops the run here, saying what
to change, not hours into it.
"""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from data_prep.content_identity import shard_bytes_content, shard_set_content
from model.architectures import EncoderConfig, config_from_preset, family_name, is_modernbert
from model.modernbert.config import PRESETS as MODERNBERT_PRESETS
from pipeline.core import app, devices
from pipeline.core.checkpoints.checkpoint_retention import Retention
from pipeline.core.checkpoints.weights import CHECKPOINT_DIR
from pipeline.core.devices import batch_split, is_first_process_on_node
from pipeline.core.optim.optimizers import (
    PER_TENSOR_OPTIMIZERS,
    check_optimizer_config,
    schedule_factor,
    warmup_steps_of,
)
from pipeline.core.run.logger_config import check_logger_config
from pipeline.core.run.run_record import InEffect, check_start
from pipeline.core.run.run_versions import run_versions
from pipeline.core.speed.fp8 import check_fp8_settings
from pipeline.core.speed.micro_batch import is_auto, most_per_pass, plan_micro_batch
from pipeline.core.speed.strategies import check_strategy_config
from pipeline.pretraining.compiled import COMPILE_SCOPES
from pipeline.pretraining.data.batch_warmup import MAX_COMPILED_STAGES, BatchWarmup
from pipeline.pretraining.pair_packing_checks import check_shard_set_for_packing, max_pairs_per_row
from pipeline.pretraining.resume_point import checkpoint_to_resume, optional_path
from pipeline.pretraining.trained_with import checkpoint_changes, module_hyper_parameters

SAMPLE_SHARDS = app.REPO_ROOT / "outputs" / "shards" / "sample"
# Trainer arguments that train() derives itself; setting them in trainer config would be silently overridden.
_DERIVED_TRAINER_KEYS = ("accumulate_grad_batches", "strategy", "logger", "callbacks", "default_root_dir",
                         "limit_val_batches", "val_check_interval", "check_val_every_n_epoch")   # from validation.*
log = logging.getLogger("pipeline.pretraining")


def model_config_of(cfg: DictConfig) -> EncoderConfig:
    """The encoder config of the model group (BERT's or ModernBERT's): a preset, with any field overridden."""
    fields = OmegaConf.to_container(cfg.model, resolve=True)
    name = fields.pop("name", None)
    fields.pop("pretraining_lr", None)   # the optimizer's default (conf/training/optimizer/adamw.yaml), not the model's
    # How it runs, not what it is: torch.compile, CUDA graphs, the decoder's padded width, FP8
    # (pipeline/core/speed/fp8.py)
    for how_it_runs in ("compile", "compile_scope", "compile_autotune", "cuda_graphs", "pad_vocab_to_multiple_of",
                        "fp8"):
        fields.pop(how_it_runs, None)
    if name not in MODERNBERT_PRESETS:
        fields.pop("attention_backend", None)   # ModernBERT's two attention paths; BERT has one
    return config_from_preset(name, **fields)


def _open_shard_set(cfg: DictConfig, model_config: EncoderConfig, output_dir: Path):
    from pipeline.pretraining.data.shard_set import ShardSet
    from pipeline.pretraining.data.verify import RECORD_NAME

    path, seq = str(cfg.data.path), int(cfg.data.max_seq_length)
    try:
        # Hash the set before the first step, so a corrupt shard stops the run now, named, rather than hours in
        # wherever its row group comes. Once per node (its local rank 0: the node's other ranks read the same files),
        # for a node-local copy (staged to /tmp or an NVMe) is that node's own; on a shared filesystem the run's
        # record of what it verified vouches for the files another node hashed (verify.py), as it spares later starts
        # (requeues, resumes) hashing the files that did not change.
        verify = cfg.data.get("verify_checksums", True) if is_first_process_on_node() else False   # true/full/false
        shard_set = ShardSet.open(path, max_seq_length=seq, vocab_size=model_config.vocab_size,
                                  verify_checksums=verify, verification_record=output_dir / RECORD_NAME)
    except FileNotFoundError as error:
        hint = ""
        if Path(path).resolve() == SAMPLE_SHARDS.resolve():
            hint = " For the bundled sample, run `python data_prep/run.py` (from the repository root) first."
        raise FileNotFoundError(f"{error}{hint}") from None
    expected = cfg.data.get("max_predictions_per_seq")
    if expected is not None and shard_set.max_predictions_per_seq != int(expected):
        raise ValueError(f"shard set {path} has max_predictions_per_seq={shard_set.max_predictions_per_seq}, but "
                         f"data.max_predictions_per_seq={expected}: these shards were made for another phase; set "
                         f"data.max_predictions_per_seq={shard_set.max_predictions_per_seq} or use the right set")
    check_documents_for_model(shard_set, model_config, path)
    return shard_set


def special_tokens_of_shard_set(model_config: EncoderConfig, shard_set) -> EncoderConfig:
    """ModernBERT's config names its special tokens' ids (its export's config.json and tokenizer say them, and [PAD]'s
    embedding row gets no gradient): the ids of the tokenizer the shards were made with. BERT's names none."""
    if not is_modernbert(model_config):
        return model_config
    ids = shard_set.special_tokens
    return dataclasses.replace(model_config, pad_token_id=ids.pad, cls_token_id=ids.cls, sep_token_id=ids.sep,
                               mask_token_id=ids.mask)


def check_init_vocabulary(tokenizer_source: Path | None, shard_set, init_from: str) -> None:
    """Weights mean what they learnt only with the tokenizer they learnt it with: phase 2 from phase 1, or continued
    pre-training from a transformers directory, refuses shards made with another vocabulary, even one of the same
    size (which the shard set's own check against model.vocab_size lets through)."""
    from data_prep.vocab import parse_vocab, tokenizer_json_tokens, vocab_sha256

    if tokenizer_source is None:
        log.warning("init_from_checkpoint=%s: found no tokenizer beside the weights, so the shard set's vocabulary "
                    "cannot be checked against theirs", init_from)
        return
    source = Path(tokenizer_source)
    vocab_file = source / "vocab.txt" if source.is_dir() else source
    if vocab_file.name == "vocab.txt" and vocab_file.is_file():
        tokens = parse_vocab(vocab_file.read_text(encoding="utf-8"))
    else:
        tokens = tokenizer_json_tokens((source / "tokenizer.json").read_text(encoding="utf-8"))
    if vocab_sha256(tokens) != shard_set.manifest["tokenizer"]["vocab_sha256"]:
        raise ValueError(f"init_from_checkpoint={init_from} was trained with the tokenizer in {source} and the shard "
                         f"set {shard_set.path} was made with another vocabulary: the weights' token ids would mean "
                         f"other tokens. Re-run data prep with that tokenizer (vocab.file={source}/vocab.txt, or "
                         f"vocab.file=null tokenizer.file={source}/tokenizer.json)")


def check_documents_for_model(shard_set, model_config: EncoderConfig, path: str) -> None:
    """A ModernBERT-class model attends within each packed document, so it needs MLM-only rows that record where
    their documents start (data prep's objective=mlm, manifest format 3 on). BERT trains on any set."""
    if not is_modernbert(model_config):
        return
    remedy = ("re-run data prep with objective=mlm masking=dynamic into a new directory, e.g. `python "
              "data_prep/run.py preset=sample_modern inputs='[...]' output_dir=<new dir>` (same tokenizer: "
              "vocab.file=/tokenizer.file=), then train with data.path=<new dir>")
    if shard_set.objective != "mlm":
        raise ValueError(f"shard set {path} holds BERT's sentence pairs with next-sentence labels "
                         f"(objective={shard_set.objective}); a ModernBERT model trains with masked LM only on packed "
                         f"documents: {remedy}")
    if not shard_set.has_document_boundaries:
        raise ValueError(f"shard set {path} records no document boundaries (made before data prep wrote them, "
                         f"manifest format {shard_set.manifest.get('format_version')}); a ModernBERT model attends "
                         f"within each document and would attend across them: {remedy}")


def check_strategy_and_optimizer(cfg: DictConfig) -> None:
    """An optimizer the pipeline does not train with (pipeline/core/optim/optimizers.py), and LAMB or StableAdamW under
    ZeRO: refused (LAMB's trust ratio and StableAdamW's update clipping are per tensor; ZeRO steps flat partitions of
    many
    tensors: zero/stage_1_and_2.py gives the optimizer one flat fp32 partition per group). Without ZeRO (stage 0)
    DeepSpeed steps the client optimizer over the model's own tensors, or their fp32 copies under bf16."""
    check_optimizer_config(cfg.optimizer)
    strategy = cfg.get("strategy") or {}
    if strategy.get("name") != "deepspeed":
        return
    stage = int((strategy.get("zero_optimization") or {}).get("stage", 0))
    if cfg.optimizer.name in PER_TENSOR_OPTIMIZERS and stage >= 1:
        what = ("LAMB's per-tensor trust ratio" if cfg.optimizer.name == "lamb" else
                "StableAdamW's per-tensor update clipping (the RMS of g^2 / v over each tensor)")
        raise ValueError(
            f"optimizer={cfg.optimizer.name} with DeepSpeed ZeRO stage {stage}: ZeRO hands the optimizer flattened "
            f"partitions of many tensors, so {what} would be computed over arbitrary slices (DeepSpeed lists "
            f"neither among its ZeRO-supported optimizers). Use strategy=ddp with optimizer={cfg.optimizer.name} "
            "(BERT-large's optimizer state fits any modern GPU), or optimizer=adamw with DeepSpeed.")


def check_compile(cfg: DictConfig, accumulation: int = 1) -> None:
    """model.compile under ZeRO-3: refused. ZeRO-3 gathers each module's parameters in forward hooks, which
    torch.compile of the encoder would have to trace through (DeepSpeed compiles its own engine for that). And
    model.cuda_graphs without model.compile: there is no compiled graph to replay; under DeepSpeed with accumulation
    (or micro_batch_size=auto, which may choose it): the engine zeroes the gradients to None, and the next backward's,
    adopted from the CUDA graph pool, are overwritten by the following pass (module.py keeps them out of the pool
    where Lightning zeroes them)."""
    strategy = cfg.get("strategy") or {}
    if str(cfg.model.get("compile_scope", "layers")) not in COMPILE_SCOPES:
        raise ValueError(f"model.compile_scope={cfg.model.compile_scope}: one of {', '.join(COMPILE_SCOPES)}")
    if cfg.model.get("cuda_graphs") and not cfg.model.get("compile"):
        raise ValueError("model.cuda_graphs=true replays the compiled graph: set model.compile=true too")
    may_accumulate = accumulation > 1 or is_auto(cfg.data.get("micro_batch_size"))
    if cfg.model.get("cuda_graphs") and strategy.get("name") == "deepspeed" and may_accumulate:
        raise ValueError("model.cuda_graphs=true with strategy=deepspeed and gradient accumulation "
                         "(data.global_batch_size over data.micro_batch_size x processes > 1, or "
                         "data.micro_batch_size=auto): DeepSpeed frees the gradients each step, and CUDA graphs would "
                         "overwrite the next ones between passes. Use strategy=ddp, a data.micro_batch_size that takes "
                         "the whole per-process batch, or model.cuda_graphs=false")
    stage = int((strategy.get("zero_optimization") or {}).get("stage", 0))
    if cfg.model.get("compile") and strategy.get("name") == "deepspeed" and stage == 3:
        raise ValueError("model.compile=true with DeepSpeed ZeRO-3: ZeRO-3 gathers each layer's parameters in module "
                         "hooks that torch.compile of the encoder would trace through; compile under ddp or ZeRO-1/2, "
                         "or set model.compile=false")


def check_batch_warmup(cfg: DictConfig, world: int, accumulation: int) -> BatchWarmup | None:
    """data.batch_warmup (pipeline/pretraining/data/batch_warmup.py): every batch of the ramp must cut into the
    world x accumulation passes of a step; one compiled graph per pass size, within torch's recompile limit; no CUDA
    graphs (a capture per shape), no DeepSpeed (its config fixes the pass size, and the combination is untested), no
    overfit_batches (it replays the first passes, of the ramp's first size). With data.micro_batch_size=auto on CUDA
    the passes are known after the probe: the datamodule checks again then."""
    warmup = BatchWarmup.from_config(cfg.data)
    if warmup is None:
        return None
    warmup.check_divides(world * accumulation)
    if (cfg.get("strategy") or {}).get("name") == "deepspeed":
        raise ValueError("data.batch_warmup with DeepSpeed: its config fixes the pass size "
                         "(train_micro_batch_size_per_gpu) and the ramp changes it; use strategy=ddp (or auto)")
    if cfg.model.get("cuda_graphs"):
        raise ValueError("data.batch_warmup with model.cuda_graphs: each stage of the ramp has a pass of its own "
                         "size, and a CUDA graph replays one shape; set model.cuda_graphs=false")
    sizes = warmup.pass_sizes(world * accumulation)
    if cfg.model.get("compile") and len(sizes) > MAX_COMPILED_STAGES:
        raise ValueError(f"data.batch_warmup with model.compile: the ramp has {len(sizes)} pass sizes, a compiled "
                         f"graph each, past torch's recompile limit of {MAX_COMPILED_STAGES} (beyond it the fullgraph "
                         "compile fails); raise data.batch_warmup.batch_size_increment")
    if int(cfg.get("overfit_batches") or 0):
        raise ValueError("data.batch_warmup with overfit_batches: the replayed passes are of the ramp's first size; "
                         "turn one of them off")
    return warmup


def check_export(cfg: DictConfig) -> None:
    """Under DeepSpeed the Hugging Face export reads the fp32 master weights from the final checkpoint (the module's
    own copies are bf16 in DeepSpeed's bf16 mode, partitioned under ZeRO-3): it needs checkpoints/last.ckpt."""
    strategy = cfg.get("strategy") or {}
    fast_dev_run = bool((cfg.get("trainer") or {}).get("fast_dev_run"))
    if (strategy.get("name") == "deepspeed" and (cfg.get("export") or {}).get("hf", True) and not fast_dev_run
            and not ((cfg.get("callbacks") or {}).get("checkpoint") or {}).get("save_last", True)):
        raise ValueError("export.hf=true under DeepSpeed exports the fp32 master weights from the run's final "
                         "checkpoint, and callbacks.checkpoint.save_last=false writes none: set "
                         "callbacks.checkpoint.save_last=true, or export.hf=false")


def _validation_settings(cfg: DictConfig, shard_set, model_config: EncoderConfig, accumulation: int) -> dict[str, Any]:
    """The Trainer's validation arguments for validation.*, after checking that the held-out set fits the model
    and was tokenized with the training set's vocabulary (else its accuracy would measure another task)."""
    from pipeline.pretraining.data.shard_set import ShardSet

    settings = cfg.get("validation") or {}
    path = settings.get("path")
    if not path:
        return {"limit_val_batches": 0}
    every = int(settings.get("every_n_steps") or 0)
    if every < 1:
        raise ValueError(f"validation.every_n_steps must be >= 1 with validation.path set, got {every}")
    held_out = ShardSet.open(str(path), max_seq_length=int(cfg.data.max_seq_length),
                             vocab_size=model_config.vocab_size)
    ours, theirs = shard_set.manifest["tokenizer"]["vocab_sha256"], held_out.manifest["tokenizer"]["vocab_sha256"]
    if ours != theirs:
        raise ValueError(f"validation.path={path} was tokenized with another vocabulary than data.path="
                         f"{cfg.data.path}: make it with data prep's vocab.file=<training set>/vocab.txt")
    if held_out.objective != shard_set.objective:
        raise ValueError(f"validation.path={path} has objective={held_out.objective} and data.path={cfg.data.path} "
                         f"objective={shard_set.objective}: make the held-out set with objective="
                         f"{shard_set.objective}")
    max_batches = settings.get("max_batches")
    # Lightning counts validation intervals in training batches (micro-batches) across epochs.
    return {"val_check_interval": every * accumulation, "check_val_every_n_epoch": None,
            "limit_val_batches": int(max_batches) if max_batches is not None else 1.0}


@dataclasses.dataclass(frozen=True)
class RunShape:
    """What a pre-training config gives at the number of processes it runs on."""
    model_config: EncoderConfig
    trainer_cfg: dict[str, Any]
    world_size: int
    micro_batch_size: int        # sequences per forward/backward pass on each process (at most data.micro_batch_size;
                                 # with auto, the whole per-process batch: the run's start sizes the pass to the card)
    accumulation: int            # micro-batches per optimizer step on each process
    max_steps: int
    schedule_steps: int
    warmup_steps: int


def preflight(cfg: DictConfig, world_size: int | None = None) -> RunShape:
    """Every check of a pre-training config that needs neither files nor devices, at `world_size` processes
    (default: what the trainer config gives on this machine): the model, the global batch over the processes and
    its split into micro-batches, the schedule, the strategy with the optimizer and the precision, the sequence
    length against the model's positions, FP8 against the accelerator and torchao (the card is checked at the run's
    start: pipeline/core/speed/fp8.py), a phase-2 start without weights to start from, the W&B mode and key. The
    workflow runs it for each pre-training stage at the shape the stage declares, before anything is submitted."""
    model_config = model_config_of(cfg)
    trainer_cfg: dict[str, Any] = OmegaConf.to_container(cfg.trainer, resolve=True)
    for key in _DERIVED_TRAINER_KEYS:
        if key in trainer_cfg:
            raise ValueError(f"trainer.{key} is set by train() (accumulate_grad_batches from "
                             "data.global_batch_size, strategy from the strategy group); remove it")
    world = world_size if world_size is not None else devices.world_size(trainer_cfg)
    most = most_per_pass(cfg.data, int(cfg.data.global_batch_size), world)   # auto: the per-process batch
    micro_batch_size, accumulation = batch_split(int(cfg.data.global_batch_size), most, world)
    if micro_batch_size < most:
        log.info("micro-batch %d x accumulation %d per process: %d sequences per step over %d processes "
                 "(data.micro_batch_size=%d is the most per pass)", micro_batch_size, accumulation,
                 int(cfg.data.global_batch_size), world, most)
    max_steps = int(trainer_cfg.get("max_steps", -1))
    if max_steps < 1 and not trainer_cfg.get("fast_dev_run"):
        raise ValueError("trainer.max_steps must be positive (training is bounded by optimizer steps), "
                         f"got {max_steps}")
    schedule_steps = int(cfg.scheduler.get("total_steps") or max(max_steps, 1))
    warmup_steps = warmup_steps_of(cfg.scheduler, schedule_steps)
    schedule_factor(cfg.scheduler, schedule_steps)     # the whole schedule's settings, refused now if wrong
    seq = int(cfg.data.max_seq_length)
    if seq > model_config.max_position_embeddings:
        raise ValueError(f"data.max_seq_length={seq} exceeds the model's max_position_embeddings="
                         f"{model_config.max_position_embeddings}; raise model.max_position_embeddings")
    check_strategy_and_optimizer(cfg)
    check_export(cfg)
    check_compile(cfg, accumulation)
    check_batch_warmup(cfg, world, accumulation)
    max_pairs_per_row(cfg, model_config)                  # data.packing: refused where it cannot run
    Retention.from_config(cfg.callbacks.checkpoint)       # callbacks.checkpoint.keep_*: refused here, not at the start
    from pipeline.pretraining.data.verify import checksum_mode
    checksum_mode(cfg.data.get("verify_checksums", True))
    if cfg.model.get("fp8") and is_modernbert(model_config):
        raise ValueError(f"model.fp8=true converts BERT's encoder projections (pipeline/core/speed/fp8.py); it is not "
                         f"built for the {family_name(model_config)} layers yet: set model.fp8=false")
    if cfg.model.get("fp8"):
        check_fp8_settings(trainer_cfg.get("accelerator", "auto"))   # the card itself is checked at the run's start
    check_strategy_config(cfg.strategy, precision=str(trainer_cfg.get("precision", "32-true")),
                          gradient_clip_val=trainer_cfg.get("gradient_clip_val"), micro_batch_size=micro_batch_size,
                          accumulate_grad_batches=accumulation)
    starts_from_weights = optional_path(cfg, "init_from_checkpoint") or optional_path(cfg, "ckpt_path")
    if cfg.get("require_init_from_checkpoint") and not starts_from_weights:
        raise ValueError("this experiment starts from the weights of an earlier run (phase 2 from phase 1): "
                         "pass init_from_checkpoint=<phase-1 output_dir>/checkpoints/last.ckpt (a .ckpt file, "
                         "a DeepSpeed checkpoint directory or an hf_export directory)")
    resumes = optional_path(cfg, "ckpt_path") or optional_path(cfg.get("resume") or {}, "continue_from")
    if cfg.get("require_resume") and not resumes:
        raise ValueError("this experiment continues a stable phase's run (the decay of warmup-stable-decay, with its "
                         "optimizer, schedule and data position): pass resume.continue_from=<the stable phase's "
                         "output_dir>/checkpoints/step<N>.ckpt (or last.ckpt), into an output_dir of its own")
    check_logger_config(cfg.logger)
    return RunShape(model_config, trainer_cfg, world, micro_batch_size, accumulation, max_steps, schedule_steps,
                    warmup_steps)


class PretrainChecks:
    """Everything validated before training starts (preflight, then the files: the checkpoint to resume or start
    from, the shard set against the model), and what follows from it."""

    def __init__(self, cfg: DictConfig):
        self.output_dir = app.output_dir(cfg, "train")
        shape = preflight(cfg)
        self.model_config, self.trainer_cfg, self.world_size = shape.model_config, shape.trainer_cfg, shape.world_size
        self.max_steps = shape.max_steps
        self.schedule_steps, self.warmup_steps = shape.schedule_steps, shape.warmup_steps
        self.ckpt_path = checkpoint_to_resume(cfg, self.output_dir)
        if self.ckpt_path is not None and not Path(self.ckpt_path).exists():
            raise FileNotFoundError(f"ckpt_path={self.ckpt_path} does not exist (resume from a run's "
                                    f"{CHECKPOINT_DIR}/last.ckpt or {CHECKPOINT_DIR}/step*.ckpt)")
        # data.micro_batch_size=auto: a resume's record, or the CPU rule, or provisional until the probe at setup
        self.micro_batch = plan_micro_batch(cfg.data, self.trainer_cfg, self.world_size, self.output_dir,
                                            resume_from=self.ckpt_path)
        self.micro_batch_size, self.accumulation = self.micro_batch.size, self.micro_batch.accumulation
        self.batch_warmup = check_batch_warmup(cfg, self.world_size, self.accumulation)
        self.init_from = optional_path(cfg, "init_from_checkpoint")
        if self.init_from is not None and not Path(self.init_from).exists():
            raise FileNotFoundError(f"init_from_checkpoint={self.init_from} does not exist: phase 2 starts from the "
                                    "weights of a finished phase-1 run (its checkpoints/last.ckpt)")
        self.shard_set = _open_shard_set(cfg, self.model_config, self.output_dir)
        self.max_pairs_per_row = max_pairs_per_row(cfg, self.model_config)   # data.packing; None: one pair a row
        if self.max_pairs_per_row is not None:
            check_shard_set_for_packing(self.shard_set, str(cfg.data.path))
        self.model_config = special_tokens_of_shard_set(self.model_config, self.shard_set)
        self.validation = _validation_settings(cfg, self.shard_set, self.model_config, self.accumulation)
        self.module_hyper_parameters = module_hyper_parameters(
            cfg, self.model_config.to_dict(), self.schedule_steps, self.max_steps,
            next_sentence_prediction=self.shard_set.has_next_sentence_labels)   # the objective: the manifest's word
        # Last, with every setting checked: a resume continues the run its record names, or stops here on every rank
        self.run_record = check_start(self.output_dir, "train", self._in_effect(cfg), resuming_from=self.resumes_from)

    def _in_effect(self, cfg: DictConfig) -> InEffect:
        manifest = self.shard_set.manifest
        resumes_from = self.resumes_from
        return InEffect(
            OmegaConf.to_container(cfg, resolve=True), inputs={"data.path": shard_set_content(manifest)},
            legacy_inputs={"data.path": shard_bytes_content(manifest)},
            resolved={"world_size": self.world_size, **run_versions()},
            checkpoint_changes=(checkpoint_changes(resumes_from, cfg, self.module_hyper_parameters)
                                if resumes_from is not None else {}))

    @property
    def resumes_from(self) -> str | None:
        """The checkpoint the run resumes from: ckpt_path, or an hpc_ckpt_*.ckpt of Lightning's own SLURM requeue
        (earlier versions), which Lightning resumes from without being asked."""
        hpc = sorted(self.output_dir.glob("hpc_ckpt_*.ckpt"))
        return self.ckpt_path or (str(hpc[-1]) if hpc else None)
