"""Sentence encoder shared by the client (lookup) and FL (training)."""

from meancache.shared.encoder._locate import locate_model, packaged_minilm_dir
from meancache.shared.encoder.encoder import Encoder
from meancache.shared.encoder.pca import DEFAULT_PCA_DIMS, PCAProjection

__all__ = ["DEFAULT_PCA_DIMS", "Encoder", "PCAProjection", "locate_model", "packaged_minilm_dir"]
