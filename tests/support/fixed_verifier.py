"""A verifier with chosen probabilities over a real cache: the shipped verifier's card
(so the learned decision applies where its card fits the encoder) and a probability per
stored question, since the real model cannot be made to give a chosen one on demand."""

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import numpy as np
from meancache.client.cache import CacheSettings, SemanticCache
from meancache.client.matching.matcher import shipped_verifier

CacheFactory = Callable[..., SemanticCache]
ASKED = "How do I reverse a list in Python?"
RIGHT = "How can I reverse a list in Python?"
CLOSE = "How do I reverse a string in Python?"
OTHER = "How do I sort a list in Python?"


def just_over_threshold() -> float:
    """A probability just over the shipped verifier's threshold: a second candidate the
    ambiguity rule counts as passing, whatever threshold the shipped card has."""
    return shipped_verifier().card.threshold + 0.01


class Fixed:
    """The shipped verifier's card (so the learned decision applies) with a chosen
    probability per stored question."""

    def __init__(self, probabilities: Mapping[str, float]) -> None:
        self.card = shipped_verifier().card
        self.threshold = self.card.threshold
        self.by_text = dict(probabilities)

    def probabilities(self, query: str, candidates: Sequence[str]) -> np.ndarray:
        return np.array([self.by_text[c] for c in candidates], dtype=np.float32)


def cache_with(make_cache: CacheFactory, decision: str, verifier: Fixed,
               directory: Path | None = None) -> SemanticCache:
    # every stored question counts (tau low, no margin): the verifier and decision decide
    settings = CacheSettings(global_threshold=0.3, recall_margin=0.0, verifier="learned",
                             decision=decision)
    cache = make_cache(directory, settings=settings, verifier=verifier)
    for question in verifier.by_text:
        cache.insert(question, f"answer to {question}")
    return cache
