"""Content hashes of model directories, memoised by file size and mtime (hashing 400 MB
of MPNet on every start would cost a second)."""

import hashlib
import json
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.shared.files import write_json_atomic

if TYPE_CHECKING:
    from meancache.shared.encoder.pca import PCAProjection

_HASHED_SUFFIXES = {".safetensors", ".bin", ".json", ".txt", ".model", ".onnx"}


def _files(model_dir: Path) -> list[Path]:
    return sorted(
        p for p in model_dir.rglob("*")
        if p.is_file() and p.suffix in _HASHED_SUFFIXES and not p.name.startswith(".")
        and "onnx-cache" not in p.parts
    )


def model_fingerprint(model_dir: Path, memo_file: Path | None = None) -> str:
    """sha256 over the relative paths and contents of a model's weight and config files."""
    files = _files(model_dir)
    stat_key = json.dumps(
        [[str(p.relative_to(model_dir)), p.stat().st_size, p.stat().st_mtime_ns] for p in files]
    )
    memo: dict[str, str] = {}
    if memo_file is not None and memo_file.is_file():
        try:
            memo = json.loads(memo_file.read_text())
        except (OSError, ValueError):
            memo = {}
    key = f"{model_dir}|{hashlib.sha256(stat_key.encode()).hexdigest()}"
    if key in memo:
        return memo[key]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(model_dir)).encode())
        with path.open("rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
    fingerprint = digest.hexdigest()[:16]
    if memo_file is not None:
        memo[key] = fingerprint
        try:
            memo_file.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(memo_file, memo)
        except OSError:
            pass  # the memo only saves time
    return fingerprint


def space_version(base_version: str, pca: "PCAProjection | None") -> str:
    """The id of one vector space: the model's weights and the PCA layer after them."""
    parts = f"{base_version}|{pca.version if pca else 'full'}"
    return hashlib.sha256(parts.encode()).hexdigest()[:16]
