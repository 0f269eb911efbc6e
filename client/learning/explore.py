"""Exploration: a would-be hit whose score lies near the threshold is, with a small
probability, also sent upstream, so the region the cache serves keeps getting labels
(vCache explores the same way). The fresh answer is what the user sees; the pair is
labelled by ``agreement``. What it costs is one upstream call per explored hit: about
``rate`` of the hits within ``width`` of the threshold."""

import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Exploration:
    rate: float = 0.1  # share of near-boundary would-be hits also sent upstream
    width: float = 0.25  # how far above the threshold (in score) a hit counts as near

    def __post_init__(self) -> None:
        if not 0 <= self.rate <= 1:
            raise ValueError(f"the exploration rate must lie between 0 and 1, not {self.rate!r}")
        if self.width < 0:
            raise ValueError(f"the exploration width must not be negative, not {self.width!r}")

    def near(self, score: float, threshold: float) -> bool:
        return threshold <= score < threshold + self.width

    def explores(self, score: float, threshold: float, rng: random.Random) -> bool:
        """Whether this would-be hit is also asked upstream."""
        return self.near(score, threshold) and rng.random() < self.rate
