"""`meancache eval pairs`: how well the cache's match decision separates labelled pairs."""

from dataclasses import dataclass

import numpy as np
from meancache.client.cache.matcher import embed_texts
from meancache.shared.encoder import Encoder
from meancache.shared.pairs import Pair
from meancache.shared.progress import Progress
from meancache.shared.threshold import MatchScores, score_thresholds


@dataclass(frozen=True)
class PairsReport:
    current: MatchScores
    sweep: list[MatchScores]


def evaluate_pairs(
    pairs: list[Pair],
    encoder: Encoder,
    threshold: float,
    sweep: np.ndarray,
    progress: Progress | None = None,
) -> PairsReport:
    texts = [p.q1 for p in pairs] + [p.q2 for p in pairs]
    vectors = embed_texts(encoder, texts, progress)  # as the matcher embeds questions
    n = len(pairs)
    similarities = (vectors[:n] * vectors[n:]).sum(1)
    labels = np.array([p.label for p in pairs])
    current = score_thresholds(similarities, labels, np.array([threshold]))[0]
    return PairsReport(current, score_thresholds(similarities, labels, sweep))
