"""Sentence encoder shared by the client (lookup) and FL (training).

PCAProjection is a torch module: it is imported on first use (PEP 562), so that commands
which need no model never wait for torch.
"""

from typing import TYPE_CHECKING

from meancache.shared.encoder._locate import (
    DEFAULT_PROFILE,
    locate_model,
    packaged_minilm_dir,
    profile_threshold,
)
from meancache.shared.encoder.encoder import BACKENDS, Encoder, load_sentence_transformer

if TYPE_CHECKING:
    from meancache.shared.encoder.pca import PCAProjection

DEFAULT_PCA_DIMS = 64  # MeanCache's compressed embedding size

__all__ = ["BACKENDS", "DEFAULT_PCA_DIMS", "DEFAULT_PROFILE", "Encoder", "PCAProjection",
           "load_sentence_transformer", "locate_model", "packaged_minilm_dir",
           "profile_threshold"]


def __getattr__(name: str) -> object:
    if name == "PCAProjection":
        from meancache.shared.encoder.pca import PCAProjection

        return PCAProjection
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
