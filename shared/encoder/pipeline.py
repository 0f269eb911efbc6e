"""The encoder as one torch module: token ids -> sentence-transformers -> unit vector.

The same graph runs in PyTorch (training, the fallback) and is exported once to ONNX for
the lookup path; a PCA layer is applied after either, in NumPy (``PCAProjection.project``).
"""

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


class EmbeddingPipeline(nn.Module):
    def __init__(self, model: "SentenceTransformer") -> None:
        super().__init__()
        self.model = model
        config = getattr(getattr(model[0], "auto_model", None), "config", None)
        self._token_types = bool(getattr(config, "type_vocab_size", 0))

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        features = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self._token_types:
            features["token_type_ids"] = torch.zeros_like(input_ids)
        return F.normalize(self.model(features)["sentence_embedding"], dim=-1)
