"""CoNLL-2003 named-entity recognition: reading the files (IOB1 or IOB2), first-sub-token features (optionally with
document context), conlleval-compatible entity scores via seqeval, and the ``conll2003`` task object.

    from pipeline.finetuning.tasks import get_task
    task = get_task("conll2003")
    dev = task.read("dev", "data/conll2003")                                  # idx, doc_index, words, labels (IOB2)
    features, report = task.featurize(dev, tokenizer, {"max_seq_length": 128}, training=False)
    metrics, files = task.evaluate(dev, features, logits_per_row)             # {"f1", "PER/f1", ...}, predictions.conll
"""
from pipeline.finetuning.tasks.conll.evaluate import conll_text, evaluate, predict_tags
from pipeline.finetuning.tasks.conll.features import IGNORE_INDEX, context_sizes, ner_features, ner_report, word_pieces
from pipeline.finetuning.tasks.conll.metrics import entity_metrics
from pipeline.finetuning.tasks.conll.reader import (
           ENTITY_TYPES,
           LABELS,
           SCHEMES,
           ConllFile,
           parse_conll,
           read_conll,
           to_iob2,
)
from pipeline.finetuning.tasks.conll.task import CONLL2003, ConllTask

__all__ = ["CONLL2003", "ENTITY_TYPES", "IGNORE_INDEX", "LABELS", "SCHEMES", "ConllFile", "ConllTask", "conll_text",
           "context_sizes", "entity_metrics", "evaluate", "ner_features", "ner_report", "parse_conll",
           "predict_tags", "read_conll", "to_iob2", "word_pieces"]
