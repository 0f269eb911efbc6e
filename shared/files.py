"""Writing files that must survive a crash, and checking what was written. A file is
written beside its final place and renamed in (``atomic_path``, ``atomic_write``,
``write_atomic``, ``write_json_atomic``: the one way meancache replaces a file); the model
assembly and conversion, and the federated checkpoints, do the same with a directory."""

import contextlib
import hashlib
import json
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO


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


@contextmanager
def atomic_path(path: Path, durable: bool = False) -> Iterator[Path]:
    """A path beside ``path`` for the block to write the new file at; renamed over
    ``path`` when the block ends without an error, removed when it raises. Either way a
    kill or a crash mid-write leaves the old file (or none), never half of the new one.

    ``durable``: the new file's bytes, then the rename, are flushed to disk (fsync), so
    they also survive a power cut; without it they survive the process dying.
    """
    partial = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.partial")
    try:
        yield partial
        if durable:
            fsync_path(partial)
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            partial.unlink(missing_ok=True)
        raise
    if durable:
        fsync_path(path.parent)


@contextmanager
def atomic_write(path: Path, durable: bool = False) -> Iterator[BinaryIO]:
    """``atomic_path``, opened for binary writing (e.g. for ``np.save``)."""
    with atomic_path(path, durable) as partial, partial.open("wb") as fh:
        yield fh


def write_atomic(path: Path, data: bytes | str, durable: bool = False) -> None:
    """Replace ``path`` with ``data`` (text as UTF-8), atomically."""
    with atomic_write(path, durable) as fh:
        fh.write(data.encode() if isinstance(data, str) else data)


def write_json_atomic(path: Path, value: object, durable: bool = False) -> None:
    """Replace ``path`` with ``value`` as JSON (UTF-8), atomically."""
    write_atomic(path, json.dumps(value, ensure_ascii=False), durable)


def whole_lines(path: Path) -> bytes:
    """The whole lines of an appended-to file (JSONL a resumable run writes), after
    cutting off a last line a kill left half-written, so the next append starts a line of
    its own; b"" when there is no file."""
    if not path.is_file():
        return b""
    data = path.read_bytes()
    whole = data[:data.rfind(b"\n") + 1]
    if len(whole) < len(data):
        with path.open("r+b") as file:
            file.truncate(len(whole))
    return whole
