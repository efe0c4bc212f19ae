"""The ten tasks: GLUE's nine (file formats as the GLUE download ships them) and SWAG; and the tasks with their
own features and evaluation (SPAN_TOKEN_TASKS: SQuAD v1.1, pipeline.finetuning.tasks.squad; CoNLL-2003,
pipeline.finetuning.tasks.conll).

Label ids follow the hub's ClassLabel order (``nyu-mll/glue``), so hub-layout data and GLUE's TSVs agree.
``file_labels`` are the labels as the TSVs (and the leaderboard) write them: text for MNLI, QNLI and RTE, 0/1 for
the other classification tasks.
"""
from __future__ import annotations

from pipeline.finetuning.tasks.base import Task
from pipeline.finetuning.tasks.conll.task import CONLL2003
from pipeline.finetuning.tasks.layouts import FileLayout, HubLayout
from pipeline.finetuning.tasks.squad.task import SQUAD_V1

GLUE_HUB = "nyu-mll/glue"
SWAG_HUB = "allenai/swag"

_BINARY = ("0", "1")
_DEFAULT_SPLITS = {"train": "train.tsv", "dev": "dev.tsv", "test": "test.tsv"}


def _hub_splits(config: str) -> dict[str, tuple[str, str]]:
    return {"train": (config, "train"), "dev": (config, "validation"), "test": (config, "test")}


def _glue_pair_task(name: str, leaderboard: str, label_names, file_labels, text_a: str, text_b: str,
                    label: str = "label", index: str = "index", hub_a: str = "sentence1", hub_b: str = "sentence2",
                    metric_set: str = "acc") -> Task:
    """A sentence-pair task in GLUE's usual shape: train/dev/test TSVs with a header."""
    return Task(
        name=name, kind="classification", label_names=label_names, file_labels=file_labels,
        main_metric="acc_and_f1" if metric_set == "acc_and_f1" else "acc", metric_set=metric_set,
        splits=dict(_DEFAULT_SPLITS), eval_splits=("dev",), test_splits=("test",),
        layouts=(FileLayout(text_a=text_a, text_b=text_b, label=label, index=index),),
        submission_files={"test": leaderboard},
        hub=HubLayout(GLUE_HUB, _hub_splits(name), text_a=hub_a, text_b=hub_b),
    )


COLA = Task(
    name="cola", kind="classification", label_names=("unacceptable", "acceptable"), file_labels=_BINARY,
    main_metric="mcc", metric_set="mcc",
    splits=dict(_DEFAULT_SPLITS), eval_splits=("dev",), test_splits=("test",),
    # GLUE's CoLA train/dev are the raw release's in_domain_train/in_domain_dev files, headerless
    other_file_names={"train": ("in_domain_train.tsv",), "dev": ("in_domain_dev.tsv",)},
    layouts=(
        FileLayout(text_a="sentence", label="label", index="index"),   # GLUE's test.tsv: index, sentence
        FileLayout(text_a="sentence", label="label", names=("source", "label", "original_mark", "sentence")),
    ),
    submission_files={"test": "CoLA.tsv"},
    hub=HubLayout(GLUE_HUB, _hub_splits("cola"), text_a="sentence"),
)

SST2 = Task(
    name="sst2", kind="classification", label_names=("negative", "positive"), file_labels=_BINARY,
    main_metric="acc", splits=dict(_DEFAULT_SPLITS), eval_splits=("dev",), test_splits=("test",),
    layouts=(FileLayout(text_a="sentence", label="label", index="index"),),
    submission_files={"test": "SST-2.tsv"},
    hub=HubLayout(GLUE_HUB, _hub_splits("sst2"), text_a="sentence"),
)

MRPC = _glue_pair_task("mrpc", "MRPC.tsv", ("not_equivalent", "equivalent"), _BINARY, "#1 String", "#2 String",
                       label="Quality", metric_set="acc_and_f1")

STSB = Task(
    name="stsb", kind="regression", label_names=None, main_metric="pearson_spearman_mean",
    metric_set="pearson_spearman", splits=dict(_DEFAULT_SPLITS), eval_splits=("dev",), test_splits=("test",),
    other_file_names={"train": ("sts-train.csv",), "dev": ("sts-dev.csv",), "test": ("sts-test.csv",)},
    layouts=(
        # GLUE's TSV: index genre filename year old_index source1 source2 sentence1 sentence2 score
        FileLayout(text_a="sentence1", text_b="sentence2", label="score", index="index"),
        # the original release: tab separated, no header; some rows carry two more source columns
        FileLayout(text_a="sentence1", text_b="sentence2", label="score", required=7,
                   names=("genre", "filename", "year", "old_index", "score", "sentence1", "sentence2",
                          "source1", "source2")),
    ),
    submission_files={"test": "STS-B.tsv"},
    hub=HubLayout(GLUE_HUB, _hub_splits("stsb"), text_a="sentence1", text_b="sentence2"),
)

QQP = _glue_pair_task("qqp", "QQP.tsv", ("not_duplicate", "duplicate"), _BINARY, "question1", "question2",
                      label="is_duplicate", index="id", hub_a="question1", hub_b="question2",
                      metric_set="acc_and_f1")

_MNLI_LABELS = ("entailment", "neutral", "contradiction")
MNLI = Task(
    name="mnli", kind="classification", label_names=_MNLI_LABELS, file_labels=_MNLI_LABELS, main_metric="acc",
    splits={"train": "train.tsv", "dev_matched": "dev_matched.tsv", "dev_mismatched": "dev_mismatched.tsv",
            "test_matched": "test_matched.tsv", "test_mismatched": "test_mismatched.tsv", "ax": "diagnostic.tsv"},
    eval_splits=("dev_matched", "dev_mismatched"), test_splits=("test_matched", "test_mismatched", "ax"),
    # GLUE's download puts the diagnostic set in glue_data/diagnostic/, beside glue_data/MNLI/
    other_file_names={"ax": ("../diagnostic/diagnostic.tsv",)},
    layouts=(FileLayout(text_a="sentence1", text_b="sentence2", label="gold_label", index="index"),),
    submission_files={"test_matched": "MNLI-m.tsv", "test_mismatched": "MNLI-mm.tsv", "ax": "AX.tsv"},
    hub=HubLayout(GLUE_HUB, {"train": ("mnli", "train"), "dev_matched": ("mnli", "validation_matched"),
                             "dev_mismatched": ("mnli", "validation_mismatched"),
                             "test_matched": ("mnli", "test_matched"), "test_mismatched": ("mnli", "test_mismatched"),
                             "ax": ("ax", "test")},
                  text_a="premise", text_b="hypothesis"),
)

QNLI = _glue_pair_task("qnli", "QNLI.tsv", ("entailment", "not_entailment"), ("entailment", "not_entailment"),
                       "question", "sentence", hub_a="question", hub_b="sentence")

RTE = _glue_pair_task("rte", "RTE.tsv", ("entailment", "not_entailment"), ("entailment", "not_entailment"),
                      "sentence1", "sentence2")

WNLI = _glue_pair_task("wnli", "WNLI.tsv", ("not_entailment", "entailment"), _BINARY, "sentence1", "sentence2")

_ENDINGS = ("ending0", "ending1", "ending2", "ending3")
SWAG = Task(
    name="swag", kind="multiple_choice", label_names=("0", "1", "2", "3"), file_labels=("0", "1", "2", "3"),
    main_metric="acc", splits={"train": "train.csv", "dev": "val.csv", "test": "test.csv"},
    eval_splits=("dev",), test_splits=("test",),
    # ,video-id,fold-ind,startphrase,sent1,sent2,gold-source,ending0..3[,label]: the unnamed first column numbers rows
    layouts=(FileLayout(text_a="sent1", text_b="sent2", endings=_ENDINGS, label="label", index="",
                        delimiter=",", quoted=True),),
    hub=HubLayout(SWAG_HUB, _hub_splits("regular"), text_a="sent1", text_b="sent2", endings=_ENDINGS, index=None),
)

TASKS: dict[str, Task] = {task.name: task for task in (COLA, SST2, MRPC, STSB, QQP, MNLI, QNLI, RTE, WNLI, SWAG)}

# Tasks with their own reader, features and evaluation (read / featurize / evaluate methods) rather than a
# pipeline.finetuning.tasks.base.Task: SQuAD v1.1's spans, CoNLL-2003's entities. Kept apart from TASKS, the
# GLUE/SWAG set.
SPAN_TOKEN_TASKS: dict[str, object] = {task.name: task for task in (SQUAD_V1, CONLL2003)}

ALL_TASKS: dict[str, object] = {**TASKS, **SPAN_TOKEN_TASKS}


def _key(name: str) -> str:
    return name.lower().replace("-", "").replace("_", "")


def get_task(name: str):
    """The task called ``name`` (case-insensitive, "-" and "_" ignored: "sst-2"/"sts-b" as GLUE spells them,
    "squad-v1")."""
    by_key = {_key(task_name): task for task_name, task in ALL_TASKS.items()}
    if _key(name) not in by_key:
        raise ValueError(f"unknown task {name!r}; known tasks: {', '.join(ALL_TASKS)}")
    return by_key[_key(name)]
