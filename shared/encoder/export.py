"""The encoder's ONNX export: made once per model state (before PCA, so every PCA layer
shares it), its int8 variant quantised from it, each checked against PyTorch before it
runs (``checked_export.check_parity``), and the few most recent kept on disk."""

import contextlib
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.shared.encoder.backends import TorchEmbedder
from meancache.shared.encoder.checked_export import (
    CheckedExport,
    check_parity,
    read_record,
    record_path,
)
from meancache.shared.encoder.fingerprint import space_version
from meancache.shared.encoder.tokens import EncoderTokenizer

if TYPE_CHECKING:
    from meancache.shared.encoder._onnx import OnnxEmbedder

log = logging.getLogger(__name__)


def export_path(cache_dir: Path, base_version: str) -> Path:
    """Where the float32 export of a model state lives ("<path>.int8.onnx": its int8 one)."""
    return cache_dir / "onnx" / f"{space_version(base_version, None)}.onnx"


def checked_export(cache_dir: Path | None, version: str,
                   backend: str) -> CheckedExport | None:
    """The checked export ``backend`` would run for model state ``version``, if recorded."""
    if cache_dir is None or backend == "torch":
        return None
    path = export_path(cache_dir, version)
    if backend == "onnx-int8":  # only its own variant: a float32 one may predate the switch
        return read_record(path.with_suffix(".int8.onnx"), backend)
    return read_record(path, backend)


def start_onnx(reference: TorchEmbedder, tokenizer: EncoderTokenizer, full_dim: int,
               path: Path, int8: bool) -> "OnnxEmbedder":
    """The checked export of ``reference`` at ``path`` (made now if missing); ``int8``:
    its int8 variant when that passes its own check, else the float32 one. Raises when
    neither can run (the export is then removed: the next start tries a fresh one)."""
    embedder = _start_int8(reference, tokenizer, full_dim, path) if int8 else None
    try:
        embedder = embedder or check_parity(_exported(reference, tokenizer, path), reference,
                                            tokenizer, full_dim)
    except Exception:  # export can fail in many ways
        remove_export(path)
        raise
    _prune_exports(embedder.path)
    return embedder


def _exported(reference: TorchEmbedder, tokenizer: EncoderTokenizer, path: Path
              ) -> "OnnxEmbedder":
    from meancache.shared.encoder._onnx import OnnxEmbedder, export_pipeline
    from meancache.shared.encoder.pipeline import EmbeddingPipeline

    if not path.is_file():
        log.info("exporting encoder to ONNX at %s", path)
        export_pipeline(EmbeddingPipeline(reference.model).eval(),
                        tokenizer.batch(["hello world", "a b c"]), path)
    return OnnxEmbedder(path)


def _start_int8(reference: TorchEmbedder, tokenizer: EncoderTokenizer, full_dim: int,
                full: Path) -> "OnnxEmbedder | None":
    """The int8 variant, quantised once from the float32 export (which is then deleted:
    it is only needed again if the int8 file is); None, with the reason logged, when it
    cannot be made or fails its check."""
    from meancache.shared.encoder._onnx import OnnxEmbedder, quantize_in_blocks

    path = full.with_suffix(".int8.onnx")
    try:
        if not path.is_file():
            _exported(reference, tokenizer, full)
            quantize_in_blocks(full, path)
        embedder = check_parity(OnnxEmbedder(path, "onnx-int8"), reference, tokenizer,
                                full_dim, int8=True)
    except Exception as exc:  # the float32 export still works
        log.warning("encoder runs in float32: its int8 variant failed (%s: %s)",
                    type(exc).__name__, exc)
        remove_export(path)
        return None
    remove_export(full)
    return embedder


def remove_export(path: Path) -> None:
    """An export and its record (a record without its export is never trusted anyway)."""
    for each in (path, record_path(path)):
        with contextlib.suppress(OSError):
            each.unlink()


def _prune_exports(current: Path, keep: int = 3) -> None:
    """Each model state (base model, FL round) exports 90-440 MB; keep the few most recently
    used, so that switching back and forth stays cheap but the disk does not fill up."""
    with contextlib.suppress(OSError):
        current.touch()
        exports = sorted(current.parent.glob("*.onnx"), key=lambda p: p.stat().st_mtime,
                         reverse=True)
        for old in exports[keep:]:
            remove_export(old)
