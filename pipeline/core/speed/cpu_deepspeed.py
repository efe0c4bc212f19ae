"""DeepSpeed on CPU processes: Lightning's DeepSpeedStrategy with DeepSpeed's CPU accelerator (DS_ACCELERATOR=cpu) and
gloo. What `trainer=cpu strategy=deepspeed_stage_*` runs: a ZeRO recipe checked end to end on a laptop or a CPU node
(a dry run of a GPU experiment, the multi-rank tests), the same code path as on GPUs but for the three places below.
"""
from __future__ import annotations

import argparse
import functools
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from lightning_fabric.utilities.seed import reset_seed
from pytorch_lightning.accelerators import CPUAccelerator
from pytorch_lightning.strategies import DeepSpeedStrategy

from pipeline.core.checkpoints.deepspeed_checkpoints import CompleteCheckpointsDeepSpeedStrategy


class CPUDeepSpeedStrategy(CompleteCheckpointsDeepSpeedStrategy):
    """Lightning's DeepSpeedStrategy on CPU processes (DeepSpeed's CPU accelerator, DS_ACCELERATOR=cpu, gloo), with
    the complete-or-absent checkpoints of pipeline/core/checkpoints/deepspeed_checkpoints.py as on GPUs.

    Lightning assumes CUDA in exactly three places; each override below lifts one of them when the device is the
    CPU and defers to Lightning otherwise, so this class behaves exactly like its parent on GPUs:
      1. `setup_environment` refuses any accelerator that is not a CUDAAccelerator.
      2. `setup_distributed` calls `_validate_device_index_selection`, which wants devices cuda:0..n-1 (a CPU
         device has no index).
      3. `deepspeed.initialize` gets `args.device_rank = self.root_device.index`, None on CPU, which DeepSpeed
         compares with 0 (TypeError), in both the fit (`_setup_model_and_optimizer`) and the inference
         (`_initialize_deepspeed_inference`) set-up. The local rank is passed instead: with a negative rank
         DeepSpeed would assume a world of one and not partition anything.
    """

    strategy_name = "deepspeed_cpu"

    def _on_cpu(self) -> bool:
        return self.root_device.type == "cpu"

    def setup_environment(self) -> None:
        if isinstance(self.accelerator, CPUAccelerator):
            super(DeepSpeedStrategy, self).setup_environment()   # DDPStrategy's: device set-up + setup_distributed
        else:
            super().setup_environment()

    def setup_distributed(self) -> None:
        if not self._on_cpu():
            return super().setup_distributed()
        # DeepSpeedStrategy.setup_distributed without the CUDA device-index check
        reset_seed()
        self.set_world_ranks()
        self._init_deepspeed_distributed()

    def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):  # type: ignore[no-untyped-def]
        with self._device_rank_from_local_rank():
            return super()._setup_model_and_optimizer(model, optimizer, lr_scheduler)

    def _initialize_deepspeed_inference(self, model) -> None:  # type: ignore[no-untyped-def]
        with self._device_rank_from_local_rank():
            super()._initialize_deepspeed_inference(model)

    @contextmanager
    def _device_rank_from_local_rank(self) -> Iterator[None]:
        """While Lightning's own set-up code runs, give `deepspeed.initialize` the local rank as `device_rank` where
        Lightning passes None (the CPU device's index). Wrapping the call, rather than copying Lightning's two
        set-up methods, keeps everything else they do (and any later change to them) intact."""
        import deepspeed

        if not self._on_cpu():
            yield
            return
        initialize, local_rank = deepspeed.initialize, self.local_rank

        @functools.wraps(initialize)
        def initialize_with_device_rank(*args: Any, **kwargs: Any) -> Any:
            namespace = kwargs.get("args")
            if namespace is not None and getattr(namespace, "device_rank", 0) is None:
                kwargs["args"] = argparse.Namespace(**{**vars(namespace), "device_rank": local_rank})
            return initialize(*args, **kwargs)

        deepspeed.initialize = initialize_with_device_rank
        try:
            yield
        finally:
            deepspeed.initialize = initialize
