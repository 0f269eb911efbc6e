"""Sentence encoder shared by the client (lookup) and FL (training)."""

from shared.encoder._locate import locate_model, packaged_minilm_dir
from shared.encoder.encoder import Encoder
from shared.encoder.pca import DEFAULT_PCA_DIMS, PCAProjection

__all__ = ["DEFAULT_PCA_DIMS", "Encoder", "PCAProjection", "locate_model", "packaged_minilm_dir"]
