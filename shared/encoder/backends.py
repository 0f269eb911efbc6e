"""The encoder's backends: what turns token ids into full-space unit vectors.

The ``Encoder`` is a pipeline of parts, as a sentence-transformers model is a list of
modules: its tokenizer (``tokens.py``), one backend from here (PyTorch, or an ONNX export
on onnxruntime: ``_onnx.OnnxEmbedder``, made and checked by ``export.py``), then the PCA
layer (``pca.py``), applied after either backend in NumPy.
"""

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class Embedder(Protocol):
    """Token ids and their mask -> unit vectors (n, full_dim) float32."""

    backend: str  # "torch", "onnx" or "onnx-int8"

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray: ...


class TorchEmbedder:
    """The PyTorch model (training, the fallback, and the reference every export is
    checked against). torch is imported on the first call."""

    backend = "torch"

    def __init__(self, model: "SentenceTransformer") -> None:
        self.model = model

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        import torch
        from meancache.shared.encoder.pipeline import EmbeddingPipeline

        with torch.inference_mode():
            return EmbeddingPipeline(self.model).eval()(
                torch.from_numpy(input_ids.astype(np.int64)),
                torch.from_numpy(attention_mask.astype(np.int64)),
            ).numpy()
