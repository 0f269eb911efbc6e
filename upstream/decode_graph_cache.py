"""The int4 decode graph kept on disk (``<data dir>/models/decode-graphs``).

Exporting Gemma 3 270M's decode step and packing it takes about two minutes on
two cores, at every start; reading it back takes a second. A graph is named by the sha256
of everything it is computed from: the model's weights and config, the exporter's settings
and the versions of torch, onnx and onnxruntime that export and quantise it, so a changed
model or library builds a new graph rather than loading a stale one. Each graph is written
beside its place and renamed in (shared.files), then its own sha256 beside it; a graph
whose bytes do not match that record (truncated, damaged, or written without one) is
rebuilt, with a log line, never loaded. Only the ``KEEP`` most recently used graphs stay.
A kept graph is opened from its file, not from its bytes in memory: ONNX Runtime then
holds 210 MB less of Gemma 3 270M's graph (293 MB against 501 MB, resident, measured).
"""

import hashlib
import json
import logging
import os
from collections.abc import Callable
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from filelock import FileLock
from meancache.shared.files import sha256_file, write_atomic

if TYPE_CHECKING:
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

KEEP = 2  # graphs kept (218 MB each for Gemma 3 270M): the one in use and the one before
SUFFIX = ".onnx"
RECORD = ".sha256"  # beside each graph: the sha256 of its bytes, written after it
LIBRARIES = ("torch", "onnx", "onnxruntime")


def graph_dir(data_dir: Path) -> Path:
    return data_dir / "models" / "decode-graphs"


def graph_key(model: "PreTrainedModel", settings: dict[str, object]) -> str:
    """The sha256 of the model's weights (in order, with names, shapes and dtypes), its
    config, ``settings`` (the exporter's) and the exporting libraries' versions."""
    import torch

    digest = hashlib.sha256()
    header = {"settings": settings, "config": model.config.to_dict(),
              "versions": {name: metadata.version(name) for name in LIBRARIES}}
    digest.update(json.dumps(header, sort_keys=True, default=str).encode())
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        digest.update(f"\n{name} {tuple(tensor.shape)} {tensor.dtype}\n".encode())
        flat = tensor.detach().cpu().contiguous().reshape(-1)
        digest.update(flat.view(torch.uint8).numpy().data)
    return digest.hexdigest()


def cached_graph(directory: Path, key: str, build: Callable[[], bytes]) -> Path:
    """The file of the graph named ``key`` in ``directory``, checked intact, or else built
    and kept there first.

    Under a file lock, so that a second process starting meanwhile waits for the first
    build instead of building (and writing) the same graph again."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{key}{SUFFIX}"
    with FileLock(directory / ".lock"):
        if _intact(path) is not None:
            os.utime(path)  # used: the last to go
            log.info("decode graph read from %s", path)
            return path
        graph = build()
        write_atomic(path, graph, durable=True)
        write_atomic(_record(path), hashlib.sha256(graph).hexdigest(), durable=True)
        log.info("decode graph kept in %s (%.0f MB)", path, len(graph) / 1e6)
        _drop_stale(directory)
    return path


def _record(path: Path) -> Path:
    return path.with_name(path.name + RECORD)


def _intact(path: Path) -> Path | None:
    """``path`` if its bytes match their record (hashed in blocks, not read whole); None
    (with a log line where there was something to read) otherwise."""
    if not path.exists() and not _record(path).exists():
        return None
    try:
        digest = sha256_file(path)
        expected = _record(path).read_text().strip()
    except OSError as exc:
        log.warning("the kept decode graph %s is unreadable (%s); building it again", path, exc)
        return None
    if digest != expected:
        log.warning("the kept decode graph %s does not match its recorded sha256 "
                    "(truncated or damaged); building it again", path)
        return None
    return path


def _drop_stale(directory: Path) -> None:
    """Keep the ``KEEP`` most recently used graphs; remove the rest, their records, records
    without a graph, and what killed writes left (their partial files)."""
    graphs = sorted(directory.glob(f"*{SUFFIX}"), key=lambda p: p.stat().st_mtime_ns,
                    reverse=True)
    stale = graphs[KEEP:]
    kept = {_record(p) for p in graphs[:KEEP]}
    stale += [p for p in directory.glob(f"*{SUFFIX}{RECORD}") if p not in kept]
    stale += list(directory.glob(".*.partial"))
    for path in stale:
        log.info("removing the stale decode graph file %s", path)
        path.unlink(missing_ok=True)
