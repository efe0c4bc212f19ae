"""Names of the files in a shard set directory."""
import os

MANIFEST_NAME = "manifest.json"
VOCAB_NAME = "vocab.txt"
TOKENIZER_NAME = "tokenizer.json"
NO_INSTANCES_NAME = "no_instances.json"   # written instead of the manifest by a job that made no instance


def shard_name(index: int, count: int, extension: str) -> str:
    return f"shard-{index:05d}-of-{count:05d}.{extension}"


def set_file(directory: str, name: str) -> str:
    """The path of a set's file: joined as a URI in a set elsewhere (gs://, s3://), as a local path on a disk."""
    return f"{directory.rstrip('/')}/{name}" if "://" in directory else os.path.join(directory, name)
