"""The encoder as one torch module: token ids -> sentence-transformers -> PCA -> unit vector.

Keeping the whole path in one module lets the same graph run in PyTorch (training, the
fallback) and be exported once to ONNX for the lookup path.
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from meancache.shared.encoder.pca import PCAProjection
    from sentence_transformers import SentenceTransformer


class EmbeddingPipeline(nn.Module):
    def __init__(self, model: "SentenceTransformer", pca: "PCAProjection | None") -> None:
        super().__init__()
        self.model = model
        self.pca = pca
        config = getattr(getattr(model[0], "auto_model", None), "config", None)
        self._token_types = bool(getattr(config, "type_vocab_size", 0))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self._token_types:
            features["token_type_ids"] = torch.zeros_like(input_ids)
        embedding = self.model(features)["sentence_embedding"]
        if self.pca is not None:
            embedding = self.pca(embedding)
        return F.normalize(embedding, dim=-1)
