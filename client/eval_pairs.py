"""`meancache eval pairs`: how well the cache's match decision separates labelled pairs.

It measures the whole decision, as a lookup makes it (``Matcher.decide``, with the
configured verifier: the rules at tau, or the learned one from the recall tau at its
threshold): ``q1`` is the stored question, ``q2``
the one asked. Beside it, the embedding alone ("similarity >= threshold") at the current
tau and at each threshold of the sweep.
"""

from dataclasses import dataclass

import numpy as np
from meancache.client.matching.matcher import Match, Matcher
from meancache.client.matching.question import Candidate, Question, embed_texts
from meancache.shared.pairs import Pair
from meancache.shared.progress import Progress
from meancache.shared.query import embedding_text
from meancache.shared.threshold import MatchScores, score_thresholds


@dataclass(frozen=True)
class PairsReport:
    decision: MatchScores  # the whole decision (threshold: the tau it ran at)
    current: MatchScores  # the embedding alone at the threshold asked for
    sweep: list[MatchScores]  # the embedding alone


def decide_pairs(pairs: list[Pair], matcher: Matcher, vectors: np.ndarray) -> np.ndarray:
    """1 where the matcher would serve ``q1``'s answer for ``q2``; ``vectors`` holds the
    q1 vectors then the q2 vectors."""
    n = len(pairs)
    served = np.zeros(n, dtype=np.int8)
    for i, pair in enumerate(pairs):
        similarity = float(vectors[i] @ vectors[n + i])
        question = Question(pair.q2, embedding_text(pair.q2), vectors[n + i],
                            matcher.encoder.is_truncated(pair.q2))
        decision = matcher.decide(question, [Candidate("q1", pair.q1, similarity)])
        served[i] = isinstance(decision, Match)
    return served


def evaluate_pairs(
    pairs: list[Pair],
    matcher: Matcher,
    threshold: float,
    sweep: np.ndarray,
    progress: Progress | None = None,
) -> PairsReport:
    texts = [p.q1 for p in pairs] + [p.q2 for p in pairs]
    vectors = embed_texts(matcher.encoder, texts, progress)  # as the matcher embeds them
    n = len(pairs)
    similarities = (vectors[:n] * vectors[n:]).sum(1)
    labels = np.array([p.label for p in pairs])
    served = decide_pairs(pairs, matcher, vectors)
    decision = score_thresholds(served.astype(float), labels, np.array([0.5]))[0]
    current = score_thresholds(similarities, labels, np.array([threshold]))[0]
    return PairsReport(MatchScores(matcher.tau, *list(decision.as_dict().values())[1:]),
                       current, score_thresholds(similarities, labels, sweep))
