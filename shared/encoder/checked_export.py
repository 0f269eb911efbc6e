"""The parity check of an ONNX export with PyTorch, and the record of one that passed it.

Written beside the export (``<export>.json``) once the check passes, with what running the
export needs besides the file: the tokenizer, the window and the width. The next start reads
it and runs the export alone, without torch, sentence-transformers or the PyTorch weights
(for MPNet that is about 4 s of a start and 440 MB of memory). A record whose export is gone
or is not the file that was checked (another size) is not trusted: that start checks afresh.
"""

import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.shared.encoder.backends import Embedder
from meancache.shared.encoder.tokens import EncoderTokenizer
from meancache.shared.errors import OnnxBackendError
from meancache.shared.files import atomic_path

if TYPE_CHECKING:
    from meancache.shared.encoder._onnx import OnnxEmbedder

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckedExport:
    path: Path  # the .onnx file
    backend: str  # "onnx" or "onnx-int8"
    full_dim: int
    min_cosine: float  # its parity with PyTorch when it was checked
    tokenizer: EncoderTokenizer


def check_parity(embedder: "OnnxEmbedder", reference: Embedder, tokenizer: EncoderTokenizer,
                 full_dim: int, *, int8: bool = False) -> "OnnxEmbedder":
    """``embedder`` if its vectors match ``reference``'s (PyTorch) on sample queries
    (cosine; ``int8``: the int8 variant's looser bound), recorded as checked so that later
    starts run it alone; OnnxBackendError if they do not."""
    from meancache.shared.encoder._onnx import (
        INT8_PARITY_MIN_COSINE,
        PARITY_MIN_COSINE,
        PARITY_QUERIES,
        min_parity_cosine,
    )

    minimum = INT8_PARITY_MIN_COSINE if int8 else PARITY_MIN_COSINE
    tokens = tokenizer.batch(PARITY_QUERIES)
    cosine = min_parity_cosine(embedder(tokens.input_ids, tokens.attention_mask),
                               reference(tokens.input_ids, tokens.attention_mask))
    path = embedder.path
    if cosine < minimum:
        raise OnnxBackendError(f"ONNX parity check of {path.name} failed: cosine "
                               f"{cosine:.5f} < {minimum}")
    log.info("ONNX parity of %s with PyTorch: min cosine %.6f", path.name, cosine)
    write_record(CheckedExport(path, embedder.backend, full_dim, cosine, tokenizer))
    return embedder


def record_path(export: Path) -> Path:
    return export.with_suffix(".json")


def write_record(checked: CheckedExport) -> None:
    record = {"backend": checked.backend, "size": checked.path.stat().st_size,
              "full_dim": checked.full_dim, "min_cosine": checked.min_cosine,
              "tokenizer": checked.tokenizer.record()}
    with atomic_path(record_path(checked.path)) as partial:
        partial.write_text(json.dumps(record), encoding="utf-8")


def read_record(export: Path, backend: str) -> CheckedExport | None:
    """The record of ``export`` run as ``backend``, or None (logged) when there is none to
    trust: no record, an unreadable one, or an export that is not the file checked."""
    path = record_path(export)
    if not path.is_file() or not export.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        if raw["backend"] != backend or raw["size"] != export.stat().st_size:
            log.info("not using the record %s: it describes another file", path)
            return None
        return CheckedExport(export, backend, int(raw["full_dim"]), float(raw["min_cosine"]),
                             EncoderTokenizer.from_record(raw["tokenizer"]))
    except Exception as exc:  # tokenizers raises a bare Exception for a damaged pipeline
        log.warning("not using the damaged record %s (%s: %s); checking the export afresh",
                    path, type(exc).__name__, exc)
        return None
