"""The sentence encoder: a pipeline of parts, as sentence-transformers composes a model
from modules: the tokenizer (``tokens.py``), a backend (``backends.py``: PyTorch, or its
ONNX export, made and checked against PyTorch by ``export.py``; PyTorch when the export
fails), and the optional PCA layer (``pca.py``), with a version id of the whole.

torch, sentence-transformers and onnxruntime are imported where a model is built or run,
so that importing this module (as every command does) stays fast. Once an ONNX export has
passed its parity check, later starts run it alone (``checked_export``): no torch at all.
"""

import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from meancache.shared.encoder._locate import locate_model
from meancache.shared.encoder.backends import Embedder, TorchEmbedder
from meancache.shared.encoder.export import checked_export, export_path, start_onnx
from meancache.shared.encoder.fingerprint import model_fingerprint, space_version
from meancache.shared.encoder.global_weights import global_version, load_global_weights
from meancache.shared.encoder.tokens import EncoderTokenizer, Tokenized
from meancache.shared.errors import EncoderError
from meancache.shared.progress import Progress

if TYPE_CHECKING:
    from meancache.shared.encoder._onnx import OnnxEmbedder
    from meancache.shared.encoder.pca import PCAProjection
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

BACKENDS = ("onnx", "onnx-int8", "torch")  # onnxruntime float32 or int8, or PyTorch

__all__ = ["BACKENDS", "Encoder", "Tokenized", "load_sentence_transformer"]


class Encoder:
    """Embeds query texts into unit vectors; ``version`` names the exact vector space.

    The version hashes the model's weights and the PCA layer, so two processes (or a
    process before and after an FL round) agree on whether stored vectors are comparable.
    """

    def __init__(
        self,
        model_dir: Path,
        base_version: str,
        tokenizer: EncoderTokenizer,
        full_dim: int,
        pca: "PCAProjection | None" = None,
        backend: str = "onnx",
        cache_dir: Path | None = None,
        *,
        model: "SentenceTransformer | None" = None,
        onnx: "OnnxEmbedder | None" = None,
        model_version: str | None = None,
    ) -> None:
        """``model``: the PyTorch model, None when ``onnx`` is a checked export of it;
        ``onnx``: that export, shared by the base model's PCA variants.
        ``model_version``: the packaged model's own fingerprint, without FL global
        weights over it (``base_version`` covers those too); by default the same."""
        _check_backend(backend)
        self.model_dir = model_dir
        self.base_version = base_version
        self.model_version = model_version or base_version
        self.tokenizer = tokenizer
        self.full_dim = full_dim
        self.pca = pca
        self.cache_dir = cache_dir
        self._model = model
        self.requested_backend = backend
        self.backend = "torch"
        self.fallback_reason: str | None = None
        self._onnx: OnnxEmbedder | None = None
        if backend != "torch" and onnx is not None:
            self._onnx, self.backend = onnx, onnx.backend
        elif backend != "torch":
            self._start_onnx()

    # construction -------------------------------------------------------------------
    @classmethod
    def load(
        cls,
        model: str | os.PathLike[str] | None = None,
        *,
        pca: "PCAProjection | None" = None,
        backend: str = "onnx",
        cache_dir: Path | None = None,
        global_weights: Path | None = None,
    ) -> "Encoder":
        """Load a local sentence-transformers model (default: the packaged MiniLM).

        ``global_weights`` is an FL checkpoint directory (shared.fl.checkpoint) whose
        weights are loaded over the base model's; the version covers both. When
        ``cache_dir`` holds a checked export of exactly that model, it runs alone.
        """
        _check_backend(backend)
        model_dir = locate_model(model)
        memo = cache_dir / "fingerprints.json" if cache_dir else None
        base = model_fingerprint(model_dir, memo)
        version = base if global_weights is None else global_version(base, global_weights)
        checked = checked_export(cache_dir, version, backend)
        if checked is not None:
            from meancache.shared.encoder._onnx import OnnxEmbedder

            log.info("encoder runs %s alone (checked: min cosine %.6f)", checked.path.name,
                     checked.min_cosine)
            return cls(model_dir, version, checked.tokenizer, checked.full_dim, pca, backend,
                       cache_dir, onnx=OnnxEmbedder(checked.path, checked.backend),
                       model_version=base)
        st = load_sentence_transformer(model_dir)
        if global_weights is not None:
            load_global_weights(st, global_weights)
        max_tokens = int(st.max_seq_length or st.tokenizer.model_max_length)
        return cls(model_dir, version,
                   EncoderTokenizer.of_model_tokenizer(st.tokenizer, max_tokens),
                   int(st.get_embedding_dimension()), pca, backend, cache_dir, model=st,
                   model_version=base)

    def with_pca(self, pca: "PCAProjection | None") -> "Encoder":
        """The same model with another PCA layer (shares the loaded weights and the ONNX
        session: PCA is applied after it, so a new layer needs no new export)."""
        return Encoder(self.model_dir, self.base_version, self.tokenizer, self.full_dim, pca,
                       self.requested_backend, self.cache_dir, model=self._model,
                       onnx=self._onnx, model_version=self.model_version)

    # identity -----------------------------------------------------------------------
    @property
    def version(self) -> str:
        return space_version(self.base_version, self.pca)

    @property
    def dim(self) -> int:
        return self.pca.out_dim if self.pca is not None else self.full_dim

    @property
    def max_tokens(self) -> int:
        return self.tokenizer.max_tokens

    @property
    def sentence_transformer(self) -> "SentenceTransformer":
        """The PyTorch model (for training): only an encoder loaded with backend "torch"
        keeps its weights, an ONNX one releases them once onnxruntime runs."""
        if self._onnx is not None or self._model is None:
            raise EncoderError("this encoder runs on onnxruntime and released its PyTorch "
                               "weights; load it with backend='torch' to train it")
        return self._model

    # tokens -------------------------------------------------------------------------
    def tokenize(self, texts: Sequence[str]) -> Tokenized:
        """Padded model inputs, cut to the model's window (see ``is_truncated``)."""
        return self.tokenizer.batch(texts)

    def count_tokens(self, text: str) -> int:
        return self.tokenizer.count(text)

    def is_truncated(self, text: str) -> bool:
        """Whether embedding ``text`` sees only its beginning (it is past the window)."""
        return self.count_tokens(text) > self.max_tokens

    # embedding ----------------------------------------------------------------------
    def encode(
        self, texts: Sequence[str], batch_size: int = 64, progress: Progress | None = None
    ) -> np.ndarray:
        """Unit vectors (n, dim) float32 in this encoder's space (with PCA when fitted)."""
        return self._encode(texts, batch_size, progress, full=False)

    def encode_full(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Unit vectors before PCA: what a PCA layer is fitted on."""
        return self._encode(texts, batch_size, None, full=True)

    def _encode(
        self, texts: Sequence[str], batch_size: int, progress: Progress | None, full: bool
    ) -> np.ndarray:
        texts = list(texts)
        out = np.empty((len(texts), self.full_dim if full else self.dim), dtype=np.float32)
        # Sorting by length keeps padding (wasted compute) small within each batch.
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            tokens = self.tokenize([texts[i] for i in idx])
            out[idx] = self._run(tokens.input_ids, tokens.attention_mask, full)
            if progress is not None:
                progress(min(start + batch_size, len(texts)), len(texts))
        return out

    def _run(self, input_ids: np.ndarray, attention_mask: np.ndarray, full: bool) -> np.ndarray:
        unit = self.embedder(input_ids, attention_mask)
        return unit if full else self.project(unit)

    @property
    def embedder(self) -> Embedder:
        """The backend part of the pipeline: the checked ONNX export, else PyTorch (PCA, a
        linear map, is applied after either in NumPy by ``project``)."""
        return self._onnx if self._onnx is not None \
            else TorchEmbedder(self.sentence_transformer)

    def project(self, full: np.ndarray) -> np.ndarray:
        """Full-space unit vectors (n, full_dim) into this encoder's space: what ``encode``
        gives for the same texts, without running the model again."""
        if self.pca is None:
            return full
        reduced = self.pca.project(full)
        return reduced / np.linalg.norm(reduced, axis=1, keepdims=True)

    # the ONNX backend (export.py) -----------------------------------------------------
    def _start_onnx(self) -> None:
        """Run the checked ONNX export of the model (made now if missing); "onnx-int8" its
        int8 variant when that passes its own check. PyTorch when neither can run."""
        if self.cache_dir is None:
            self._fall_back("no cache directory to keep the exported model in")
            return
        try:
            embedder = start_onnx(TorchEmbedder(self.sentence_transformer), self.tokenizer,
                                  self.full_dim, export_path(self.cache_dir, self.base_version),
                                  int8=self.requested_backend == "onnx-int8")
        except Exception as exc:  # export can fail in many ways; PyTorch always works
            self._fall_back(f"{type(exc).__name__}: {exc}")
            return
        self._onnx = embedder
        self.backend = embedder.backend
        # onnxruntime holds its own copy of the weights: PyTorch's (440 MB for MPNet) is
        # dead weight now. Tokenising and the shapes need no model.
        self._model = None

    def _fall_back(self, reason: str) -> None:
        self.fallback_reason = reason
        self.backend = "torch"
        log.warning("encoder runs on PyTorch instead of onnxruntime: %s", reason)


def load_sentence_transformer(model_dir: Path) -> "SentenceTransformer":
    """The PyTorch model in ``model_dir`` on the CPU, offline: the one way every side builds
    it (the cache's ``Encoder`` and both Flower apps), with one error for a broken
    directory."""
    from sentence_transformers import SentenceTransformer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # never draw on the user's terminal
    try:
        return SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    except Exception as exc:  # the library raises many types for a broken directory
        raise EncoderError(
            f"could not load the embedding model in {model_dir}: {exc}; check that the "
            "directory holds a complete sentence-transformers model") from exc


def _check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise EncoderError(f"unknown encoder backend {backend!r} (use "
                           + ", ".join(repr(b) for b in BACKENDS) + ")")
