"""Batch-size warm-up (ModernBERT's, after Composer's batch-size warmup): the global batch grows from a small one to
data.global_batch_size over the first data.batch_warmup.tokens tokens, and which rows each optimizer step trains on is
a pure function of the step. Pure arithmetic here; the stream that reads those rows is step_stream.py.

The ramp. Step s trains on B(s) rows: start_batch_size + increment * min(K, floor(K * T(s) / tokens)), where
K = (global_batch_size - start_batch_size) / increment and T(s) = O(s) x max_seq_length is the tokens of the steps
before s, counted as rows x sequence length (nominal tokens: packed rows are full, so for ModernBERT's data they are
the real ones; for BERT's sentence pairs a little more than the real ones). Nominal, so that B(s) depends on the step
alone, never on the lengths of the rows drawn. The batch is piecewise constant: `Stage`s, each one batch size,
computed once (a handful for a real ramp), so B(s) and O(s) are a bisection, also a million steps in.

The rows. The run's data is one endless stream: epoch e's rows, in the order step_stream.py draws from (seed, e), at
positions [e x N, (e + 1) x N) of it (N: the set's rows; nothing dropped at an epoch's end, a step may take rows of
two epochs). Step s takes positions [O(s), O(s) + B(s)), O(s) = sum of B(t) for t < s. Cut into W x A equal
micro-batches (W ranks, A micro-batches per step on each), micro-batch q = r x A + j (rank r's j-th) takes
[O(s) + q x m(s), O(s) + (q + 1) x m(s)), m(s) = B(s) / (W x A). Rank r therefore holds a contiguous slice of the step's
rows. The rows of a step depend on s only; the cut into micro-batches on W x A only (the global batch over the pass
size: one rank of 4 passes of 2 rows and two ranks of 2 passes each cut a step the same way).

Why the number of passes per step stays fixed and their size varies (rather than a fixed pass and a varying count):
Lightning's accumulate_grad_batches, the DDP no_sync logic, gradient clipping, the logged windows and the resume
position (a count of micro-batches) all assume a fixed count per step, and stay untouched; each pass's loss is the
mean over its rows and the step's gradient the mean over its W x A passes, exactly the normalisation of a step
without warm-up. The cost: a pass smaller than the card holds during the ramp, and one shape per stage, so
model.compile builds one graph per stage (checks.py bounds their number) and CUDA graphs are refused.

Every B(s) must divide into W x A passes: increment, start_batch_size and the global batch are multiples of it
(refused before the run starts otherwise, check_divides). The learning-rate schedule is in steps, unchanged.
"""
from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Mapping
from typing import Any

MAX_COMPILED_STAGES = 8     # torch._dynamo's recompile limit: past it a new pass size fails (fullgraph=True)


@dataclasses.dataclass(frozen=True)
class Stage:
    first_step: int
    batch_size: int
    first_row: int          # O(first_step): the stream position of the stage's first row


@dataclasses.dataclass(frozen=True)
class BatchWarmup:
    tokens: int                 # the ramp's length, in nominal tokens (rows x tokens_per_row)
    start_batch_size: int
    increment: int
    full_batch_size: int        # data.global_batch_size
    tokens_per_row: int         # data.max_seq_length

    def __post_init__(self):
        if self.tokens < 1 or self.tokens_per_row < 1:
            raise ValueError(f"data.batch_warmup.tokens must be positive, got {self.tokens}")
        if not 1 <= self.start_batch_size <= self.full_batch_size:
            raise ValueError(f"data.batch_warmup.start_batch_size={self.start_batch_size} must be in [1, "
                             f"data.global_batch_size={self.full_batch_size}]")
        if self.increment < 1 or self.start_batch_size % self.increment or self.full_batch_size % self.increment:
            raise ValueError(f"data.batch_warmup.batch_size_increment={self.increment} must be positive and divide "
                             f"both start_batch_size={self.start_batch_size} and data.global_batch_size="
                             f"{self.full_batch_size}: the batch grows from one to the other in these increments")
        object.__setattr__(self, "stages", tuple(self._stages()))
        object.__setattr__(self, "_first_steps", [stage.first_step for stage in self.stages])

    @classmethod
    def from_config(cls, data_cfg: Mapping[str, Any]) -> BatchWarmup | None:
        """data.batch_warmup of a config; None when it is off (tokens 0 or null, the default)."""
        settings = data_cfg.get("batch_warmup") or {}
        if not settings.get("tokens"):
            return None
        start = settings.get("start_batch_size")
        if start is None:
            raise ValueError("data.batch_warmup.tokens is set: give data.batch_warmup.start_batch_size, the global "
                             "batch the ramp starts from")
        increment = settings.get("batch_size_increment") or start
        return cls(tokens=int(settings["tokens"]), start_batch_size=int(start), increment=int(increment),
                   full_batch_size=int(data_cfg["global_batch_size"]), tokens_per_row=int(data_cfg["max_seq_length"]))

    @property
    def increments(self) -> int:
        """K: how many increments the batch grows by."""
        return (self.full_batch_size - self.start_batch_size) // self.increment

    def _stages(self) -> list[Stage]:
        k_max, per_row = self.increments, self.tokens_per_row
        stages, step, rows = [], 0, 0
        for k in range(k_max + 1):
            # Stage k begins at the first step with K x T >= k x tokens; it is empty when the step that crossed into
            # it also crossed into the next.
            if k < k_max and k_max * rows * per_row >= (k + 1) * self.tokens:
                continue
            batch = self.start_batch_size + k * self.increment
            stages.append(Stage(step, batch, rows))
            if k == k_max:
                break
            missing = (k + 1) * self.tokens - k_max * rows * per_row       # > 0: K x T must reach (k + 1) x tokens
            steps = -(-missing // (k_max * batch * per_row))
            step, rows = step + steps, rows + steps * batch
        return stages

    def stage_of(self, step: int) -> Stage:
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        return self.stages[bisect.bisect_right(self._first_steps, step) - 1]

    def batch_size(self, step: int) -> int:
        """B(s): the global batch of step s."""
        return self.stage_of(step).batch_size

    def offset(self, step: int) -> int:
        """O(s): the stream position of step s's first row (the rows of every step before it)."""
        stage = self.stage_of(step)
        return stage.first_row + (step - stage.first_step) * stage.batch_size

    @property
    def ramp_steps(self) -> int:
        """The first step at the full batch."""
        return self.stages[-1].first_step

    def check_divides(self, passes: int) -> None:
        """Every B(s) must cut into `passes` = world size x accumulation equal micro-batches of at least one row."""
        if self.increment % passes:
            raise ValueError(
                f"data.batch_warmup.batch_size_increment={self.increment} is not a multiple of the {passes} passes a "
                f"step is cut into (processes x accumulation = data.global_batch_size {self.full_batch_size} / pass "
                f"size): every batch of the ramp must split into {passes} equal passes. Choose an increment (and a "
                f"start_batch_size) that is a multiple of {passes}, for every number of processes the run may use")

    def micro_batch_span(self, step: int, rank: int, world_size: int, accumulation: int, index: int
                         ) -> tuple[int, int]:
        """[start, stop) stream positions of rank `rank`'s micro-batch `index` (of `accumulation`) in step `step`."""
        passes = world_size * accumulation
        self.check_divides(passes)
        if not (0 <= rank < world_size and 0 <= index < accumulation):
            raise ValueError(f"need 0 <= rank < {world_size} and 0 <= index < {accumulation}; got {rank}, {index}")
        size = self.batch_size(step) // passes
        start = self.offset(step) + (rank * accumulation + index) * size
        return start, start + size

    def pass_sizes(self, passes: int) -> list[int]:
        """The distinct pass sizes of the run (one per stage): what model.compile builds a graph for."""
        return sorted({stage.batch_size // passes for stage in self.stages})

    def describe(self) -> dict[str, int]:
        """What a checkpoint's position is counted in (the datamodule's state)."""
        return {"tokens": self.tokens, "start_batch_size": self.start_batch_size, "increment": self.increment,
                "full_batch_size": self.full_batch_size, "tokens_per_row": self.tokens_per_row}
