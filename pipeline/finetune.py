"""Entry point: fine-tune a BERT checkpoint on a GLUE task, SWAG, SQuAD v1.1 or CoNLL-2003, evaluate, export.

    python pipeline/finetune.py task=sst2 init=<pre-training run dir>       # the bundled SST-2 sample on the CPU
    GLUE_DIR=/data/glue python pipeline/finetune.py task=mnli init=/models/bert-base-uncased trainer.accelerator=gpu
    python pipeline/finetune.py -m task=rte init=... optimizer.lr=5e-5,4e-5,3e-5,2e-5 seed=1,2,3   # the paper's sweep
    python pipeline/finetune.py -m hydra/launcher=submitit_slurm ... # the same sweep as SLURM jobs
    python pipeline/sweep_summary.py outputs/finetune/multirun/<date>/<time>   # best dev score per task

The run itself: pipeline/finetuning/run.py.
"""
import hydra
from omegaconf import DictConfig

from pipeline.core import app  # noqa: F401  (first: silences known noise, registers the config resolvers)
from pipeline.finetuning.run import finetune, summary


@hydra.main(config_path="../conf/training", config_name="finetune", version_base="1.3")
def main(cfg: DictConfig) -> float:
    result = finetune(cfg)
    print(summary(cfg.task.name, result))
    return result["score"]   # what a Hydra sweeper would optimise


if __name__ == "__main__":
    main()
