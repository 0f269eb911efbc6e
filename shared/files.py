"""Writing files that must survive a crash, and checking what was written: the model
assembly and conversion, and the federated checkpoints, all write a directory beside its
final place, fsync it, and rename it in."""

import hashlib
import json
import os
from pathlib import Path


def sha256_file(path: Path) -> str:
    """The hex sha256 of a file, read in blocks."""
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def fsync_path(path: Path) -> None:
    """Flush a file's or a directory's entry to disk (a rename is durable only once its
    directory is synced)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def fsync_tree(root: Path) -> None:
    """Flush every file and directory under ``root``, deepest first, then ``root``."""
    for path in sorted(root.rglob("*"), reverse=True):
        fsync_path(path)
    fsync_path(root)


def write_json_atomic(path: Path, value: object) -> None:
    """Write JSON beside ``path`` and rename it in: a kill mid-write keeps the old file."""
    partial = path.with_name(path.name + ".partial")
    partial.write_text(json.dumps(value), encoding="utf-8")
    os.replace(partial, path)
