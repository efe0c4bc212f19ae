"""SQuAD v1.1: reading the JSON, features with the doc stride, n-best post-processing, the official EM/F1.

    from pipeline.finetuning.tasks.squad import SQUAD_V1
    dev = SQUAD_V1.read("dev", "squad/dev-v1.1.json", cache_dir)          # one row per question
    features, report = SQUAD_V1.featurize(dev, tokenizer, {"max_seq_length": 384}, training=False)
    metrics, artefacts = SQUAD_V1.evaluate(dev, features, outputs, {})    # outputs: (T_i, 2) per feature
"""
from pipeline.finetuning.tasks.squad.evaluate import normalize_answer, squad_v1_metrics
from pipeline.finetuning.tasks.squad.features import squad_features
from pipeline.finetuning.tasks.squad.postprocess import postprocess
from pipeline.finetuning.tasks.squad.reader import read_squad
from pipeline.finetuning.tasks.squad.task import DEFAULT_SETTINGS, SQUAD_V1, SquadTask

__all__ = ["DEFAULT_SETTINGS", "SQUAD_V1", "SquadTask", "normalize_answer", "postprocess", "read_squad",
           "squad_features", "squad_v1_metrics"]
