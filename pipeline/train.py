"""Entry point: pre-train BERT (masked LM + next sentence) on data_prep's shards, from the configs in conf/training/.

    python pipeline/train.py                                  # tiny BERT, CPU, bundled sample, a few minutes
    python pipeline/train.py model=mini trainer.max_steps=2000 optimizer.lr=3e-4
    python pipeline/train.py +experiment=bert_base            # the paper's BERT-base phase 1, GPUs, DDP
    python pipeline/train.py +experiment=bert_large_phase2 init_from_checkpoint=<phase-1 run>/checkpoints/last.ckpt
    python pipeline/train.py +debug=dryrun                    # every stage of the pipeline in a few seconds
    python pipeline/train.py ckpt_path=last hydra.run.dir=<run>   # resume a run, same logs

The run itself: pipeline/pretraining/run.py. Under SLURM, a run stopped by the requeue signal exits with status 75
(pipeline/core/cluster/requeue.py: checkpoint saved, job requeued; its next start resumes). A run stopped by SIGINT
(Ctrl-C) exits with 130, one stopped by SIGTERM (`kill`, `scancel`, an eviction) with 143: 128 + the signal's number, as
a shell reports it. Not Lightning's 1 of any failure: what restarts a failed training
(pipeline/core/cluster/restarts.py) must not start again a run that somebody stopped. And never 0, Lightning's for
SIGTERM: the workflow (pipeline/orchestration/stage_runner.py) would record the unfinished run as the stage's result. A
run refused before it starts (a resume that changes what shapes the run, a run directory in use or not writable, a
checkpoint it may not read, a setting the checks in pipeline/pretraining/checks.py refuse) prints the reason alone to
stderr and exits with 2 (pipeline.core.app.refused): nothing starts it again.
"""
import signal
import sys

import hydra
from omegaconf import DictConfig

from pipeline.core import app  # first: silences known noise, registers the config resolvers
from pipeline.core.cluster.requeue import REQUEUED_EXIT_CODE
from pipeline.pretraining.run import summary, train

STOPPED_BY: list[int] = []    # SIGINT or SIGTERM, once received
START_CHECKS = ("pipeline.pretraining.checks",)   # their ValueError or OSError refuses the run (app.refused)


def _note_interrupt(signum: int, frame) -> None:
    STOPPED_BY.append(signum)
    signal.default_int_handler(signum, frame)    # KeyboardInterrupt, as without this handler


def _note_termination(signum: int, frame) -> None:
    """SIGTERM: noted, so that whatever the run raises after it ends as a stop (143), not a failure. SLURM's `scancel
    --signal=TERM` reaches every process of the step, the loader workers too: one killed makes the rank raise
    "DataLoader worker ... is killed by signal: Terminated" wherever it is (a checkpoint's write included), before
    Lightning's own handler (which calls this one too, during the fit) stops the fit at a step boundary. Outside the
    fit (the checks, the export) this is the only handler: the run stops here, as SIGTERM's default would stop it."""
    STOPPED_BY.append(signum)
    if signal.getsignal(signal.SIGTERM) is _note_termination:
        sys.exit(128 + signum)


@hydra.main(config_path="../conf/training", config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from pytorch_lightning.utilities.exceptions import SIGTERMException  # after pipeline.core.app: its noise silenced

    try:
        result = train(cfg)
    except SIGTERMException:
        # Lightning stops the fit at a step boundary and raises this SystemExit without a code: exit 0, a finished
        # run's status. A requeue never ends here: its ranks ignore SIGTERM from the save on (requeue.py).
        sys.exit(128 + signal.SIGTERM)
    except BaseException as error:
        if STOPPED_BY:    # Lightning turns Ctrl-C into sys.exit(1), as any failure; a SIGTERM's loader error: a stop
            sys.exit(128 + STOPPED_BY[0])
        if app.refused(error, START_CHECKS):
            app.exit_refused(error)
        raise
    if result["requeued"]:
        sys.exit(REQUEUED_EXIT_CODE)
    if result["rank"] == 0:
        print(summary(result))


if __name__ == "__main__":
    signal.signal(signal.SIGINT, _note_interrupt)
    signal.signal(signal.SIGTERM, _note_termination)
    main()
