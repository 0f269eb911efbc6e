"""Sentence encoder shared by the client (lookup) and FL (training).

Importing it is light (NumPy, no torch): torch and sentence-transformers load only where a
PyTorch model is built or run, so a lookup from a checked ONNX export never waits for them.
"""

from meancache.shared.encoder._locate import (
    DEFAULT_PROFILE,
    is_mpnet,
    locate_model,
    packaged_minilm_dir,
    profile_threshold,
)
from meancache.shared.encoder.encoder import BACKENDS, Encoder, load_sentence_transformer
from meancache.shared.encoder.pca import DEFAULT_PCA_DIMS, PCAProjection

__all__ = ["BACKENDS", "DEFAULT_PCA_DIMS", "DEFAULT_PROFILE", "Encoder", "PCAProjection",
           "is_mpnet", "load_sentence_transformer", "locate_model", "packaged_minilm_dir",
           "profile_threshold"]
