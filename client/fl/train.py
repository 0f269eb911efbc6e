"""Local training, as in MeanCache: multiple-negatives ranking loss on duplicate pairs
plus a contrastive loss on all labelled pairs. (The threshold is tuned by the server on
the devices' pooled validation evidence: shared.fl.evidence.)"""

import random

import numpy as np
import torch
from meancache.shared.fl.client_config import TrainConfig
from meancache.shared.fl.weights import federated_names, training_only
from meancache.shared.pairs import Pair
from sentence_transformers import SentenceTransformer, losses


def _features(model: SentenceTransformer, texts: list[str]) -> dict[str, object]:
    """Model inputs for the texts (tensors moved to the model's device, other keys kept)."""
    features = model.preprocess(texts)
    return {k: v.to(model.device) if isinstance(v, torch.Tensor) else v
            for k, v in features.items()}


def train_locally(model: SentenceTransformer, pairs: list[Pair], config: TrainConfig
                  ) -> float:
    """Fine-tune the federated parameters in place; returns the mean loss."""
    ranking = losses.MultipleNegativesRankingLoss(model)
    contrastive = losses.ContrastiveLoss(model)
    rng = random.Random(config.seed)
    duplicates = [p for p in pairs if p.label == 1]
    total, steps = 0.0, 0
    with training_only(model, federated_names(model, config.top_layers)):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=config.learning_rate)
        for _ in range(config.epochs):
            order = list(pairs)
            rng.shuffle(order)
            rng.shuffle(duplicates)
            for start in range(0, len(order), config.batch_size):
                batch = order[start:start + config.batch_size]
                loss = contrastive(
                    [_features(model, [p.q1 for p in batch]),
                     _features(model, [p.q2 for p in batch])],
                    torch.tensor([p.label for p in batch], dtype=torch.float32,
                                 device=model.device),
                )
                dup = duplicates[start:start + config.batch_size]
                if len(dup) >= 2:  # in-batch negatives need at least two pairs
                    loss = loss + ranking(
                        [_features(model, [p.q1 for p in dup]),
                         _features(model, [p.q2 for p in dup])], torch.empty(0))
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                total += float(loss.detach())
                steps += 1
    return total / max(steps, 1)


def pair_similarities(model: SentenceTransformer, pairs: list[Pair]) -> np.ndarray:
    """Each pair's cosine; none for no pairs (a device with too few to hold any out)."""
    if not pairs:
        return np.empty(0, dtype=np.float32)
    a = model.encode([p.q1 for p in pairs], normalize_embeddings=True, batch_size=64)
    b = model.encode([p.q2 for p in pairs], normalize_embeddings=True, batch_size=64)
    return (a * b).sum(1)

