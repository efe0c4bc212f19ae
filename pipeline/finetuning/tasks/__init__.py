"""Fine-tuning tasks (GLUE's nine, SWAG, SQuAD v1.1, CoNLL-2003): reading their data, scoring predictions, writing
leaderboard and prediction files. GLUE and SWAG are declared in registry.py; SQuAD and CoNLL, which bring their
own features and evaluation, are packages (squad/, conll/).

    from pipeline.finetuning.tasks import get_task
    task = get_task("mnli")
    dev = task.read("dev_matched", "glue_data/MNLI", cache_dir="~/.cache/bert")  # idx, text_a, text_b, label
    task.metrics(predictions, dev["label"])                                        # {"acc": ...}
"""
from pipeline.finetuning.tasks.base import Task
from pipeline.finetuning.tasks.registry import TASKS, get_task
from pipeline.finetuning.tasks.submission import SUBMISSION_FILES, write_submission

__all__ = ["SUBMISSION_FILES", "TASKS", "Task", "get_task", "write_submission"]
