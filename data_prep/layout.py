"""Names of the files in a shard set directory."""

MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.txt"
TOKENIZER_NAME = "tokenizer.json"
NO_INSTANCES_NAME = "no_instances.json"   # written instead of the manifest by a job that made no instance


def shard_name(index: int, count: int, extension: str) -> str:
    return f"shard-{index:05d}-of-{count:05d}.{extension}"
