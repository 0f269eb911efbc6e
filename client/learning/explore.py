"""Exploration: a would-be hit whose score lies near the threshold is, with some
probability, also sent upstream, so the region the cache serves keeps getting labels
(vCache explores the same way). The fresh answer is what the user sees; the pair is
labelled by ``agreement``, weighted by the inverse of the chance it had in the bound.
What it costs is one upstream call per explored hit (measured on
benchmarks/learning_stream.py's streams in docs/cache.md).

Every near would-be hit is explored until labels of traffic settle the threshold
(``until_learned``; ``state.Learned.settled``): the labels chose it, enough of the
device's own, with the federation's pool, score over it to pass the test at all
(``bound.labels_needed``, 149 at 2%), and they are wrong there no more often than the
rate. So the learned decision's card, whose labels are its choose splits' and back the
bound from the first lookup, is checked against traffic before exploration eases, and
for as long as the traffic looks worse than the card; then ``rate`` of them. A width is
in the judge's score: the learned decision's within 0.05 of its threshold, ``rate`` 0.3
once settled; the verifier's probability and the cosine within 0.25, ``rate`` 0.1."""

import random
from dataclasses import dataclass

from meancache.shared.verifier.decision import DECISION_JUDGE

EXPLORE_RATE = 0.1  # the default share of near-boundary would-be hits also asked upstream
EXPLORE_WIDTH = 0.25  # the default width of "near", in the judge's score
DECISION_EXPLORE_RATE = 0.3  # ... the learned decision's score's (see above)
DECISION_EXPLORE_WIDTH = 0.05


@dataclass(frozen=True)
class Exploration:
    """``until_learned``: every near would-be hit is explored until labels of traffic
    settle the threshold (the module's docstring), ``rate`` of them afterwards.
    vCache explores most where its estimate is least certain; here that reaches the
    labels the bound needs sooner, for an upstream call per near would-be hit until then
    (measured in docs/cache.md)."""

    rate: float = EXPLORE_RATE  # share of near-boundary would-be hits also sent upstream
    width: float = EXPLORE_WIDTH  # how far above the threshold (in score) a hit counts as near
    until_learned: bool = True

    def __post_init__(self) -> None:
        if not 0 <= self.rate <= 1:
            raise ValueError(f"the exploration rate must lie between 0 and 1, not {self.rate!r}")
        if self.width < 0:
            raise ValueError(f"the exploration width must not be negative, not {self.width!r}")

    @classmethod
    def for_judge(cls, judge: str, rate: float | None = None, width: float | None = None,
                  until_learned: bool = True) -> "Exploration":
        """The exploration of ``judge``'s score: ``rate`` and ``width`` as set, the
        judge's defaults where None (the module's docstring)."""
        decision = judge.startswith(f"{DECISION_JUDGE} ")
        return cls(rate if rate is not None else
                   DECISION_EXPLORE_RATE if decision else EXPLORE_RATE,
                   width if width is not None else
                   DECISION_EXPLORE_WIDTH if decision else EXPLORE_WIDTH, until_learned)

    def near(self, score: float, threshold: float) -> bool:
        return threshold <= score < threshold + self.width

    def rate_now(self, learned: bool) -> float:
        """The chance a near would-be hit is explored now (what its label is weighted by);
        ``learned``: whether labels of traffic settled the threshold."""
        if self.rate == 0:  # exploration off, even before the labels decide
            return 0.0
        return 1.0 if self.until_learned and not learned else self.rate

    def explores(self, score: float, threshold: float, rng: random.Random,
                 learned: bool = True) -> bool:
        """Whether this would-be hit is also asked upstream (a draw is made only for a
        near one, so the seeded sequence depends on the near hits alone). ``learned``:
        whether labels of traffic settled ``threshold``."""
        rate = self.rate_now(learned)
        return self.near(score, threshold) and rate > 0 and rng.random() < rate
