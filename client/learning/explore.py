"""Exploration: a would-be hit whose score lies near the threshold is, with some
probability, also sent upstream, so the region the cache serves keeps getting labels
(vCache explores the same way). The fresh answer is what the user sees; the pair is
labelled by ``agreement``, weighted by the inverse of the chance it had in the bound.
What it costs is one upstream call per explored hit (measured on
benchmarks/learning_stream.py's streams in docs/error-bound-measured.md).

Every near would-be hit is explored until labels of traffic settle the threshold
(``until_learned``; ``state.Learned.settled``): the labels chose it, enough of the
device's own, with the federation's pool, score over it to pass the test at all
(``bound.labels_needed``, 149 at 2%), and they are wrong there no more often than the
rate. So the learned decision's card, whose labels are its choose splits' and back the
bound from the first lookup, is checked against traffic before exploration eases, and
for as long as the traffic looks worse than the card; then ``rate`` of them. A width is
in the judge's score: the learned decision's within 0.05 of its threshold, ``rate`` 0.3
once settled; the verifier's probability and the cosine within 0.25, ``rate`` 0.1.

A judge's score need not be calibrated: one that passes wrong answers may give them its
highest scores, above any band near the threshold, where the band never looks.
``beyond`` is the chance that a would-be hit above the band is explored too, before and
after the labels settle (weighted by its inverse, as every explored label is), so that
every score the cache serves keeps getting labels whatever the judge thinks of it.
``warmup``: until that many of the device's own labels score over the threshold, and
for as long as more of them than the rate are wrong, every would-be hit is explored, at
any score: evidence from elsewhere (the card's choose splits) may not fit this traffic,
and a region it backs can only be refused by labels of the traffic, which the first
would-be hits then give before any of them is served. Fifty labels cannot tell a region
wrong at 2% from one wrong at 6% (3 wrong in 50 refuse nothing: their lower confidence
limit is 1.7%), so a warm-up that looks worse than the rate goes on until the labels
either refuse the region (``bound``'s refusal: their lower limit over the rate) or come
back within the rate; a region wrong at 1% ends it at the count of 50 on 91% of devices
(at the card's own 1.6%, on 81%)."""

import random
from dataclasses import dataclass

from meancache.client.learning.bound import OwnLabels
from meancache.shared.verifier.decision import DECISION_JUDGE

EXPLORE_RATE = 0.1  # the default share of near-boundary would-be hits also asked upstream
EXPLORE_WIDTH = 0.25  # the default width of "near", in the judge's score
DECISION_EXPLORE_RATE = 0.3  # ... the learned decision's score's (see above)
DECISION_EXPLORE_WIDTH = 0.05
EXPLORE_BEYOND = 0.0  # the default share of would-be hits above the band also asked upstream
EXPLORE_WARMUP = 50  # own labels over the threshold before a would-be hit is served


@dataclass(frozen=True)
class Exploration:
    """``until_learned``: every near would-be hit is explored until labels of traffic
    settle the threshold (the module's docstring), ``rate`` of them afterwards.
    vCache explores most where its estimate is least certain; here that reaches the
    labels the bound needs sooner, for an upstream call per near would-be hit until then
    (measured in docs/error-bound-measured.md)."""

    rate: float = EXPLORE_RATE  # share of near-boundary would-be hits also sent upstream
    width: float = EXPLORE_WIDTH  # how far above the threshold (in score) a hit counts as near
    until_learned: bool = True
    beyond: float = EXPLORE_BEYOND  # share of would-be hits above the band also sent upstream
    warmup: int = EXPLORE_WARMUP  # own labels over the threshold before any hit is served

    def __post_init__(self) -> None:
        if self.warmup < 0:
            raise ValueError(f"the exploration warm-up must not be negative, not "
                             f"{self.warmup!r}")
        for name, rate in (("rate", self.rate), ("rate beyond the band", self.beyond)):
            if not 0 <= rate <= 1:
                raise ValueError(f"the exploration {name} must lie between 0 and 1, "
                                 f"not {rate!r}")
        if self.width < 0:
            raise ValueError(f"the exploration width must not be negative, not {self.width!r}")

    @classmethod
    def for_judge(cls, judge: str, rate: float | None = None, width: float | None = None,
                  until_learned: bool = True, beyond: float | None = None,
                  warmup: int | None = None) -> "Exploration":
        """The exploration of ``judge``'s score: ``rate``, ``width``, ``beyond`` and
        ``warmup`` as set, the defaults where None (the module's docstring)."""
        decision = judge.startswith(f"{DECISION_JUDGE} ")
        return cls(rate if rate is not None else
                   DECISION_EXPLORE_RATE if decision else EXPLORE_RATE,
                   width if width is not None else
                   DECISION_EXPLORE_WIDTH if decision else EXPLORE_WIDTH, until_learned,
                   beyond if beyond is not None else EXPLORE_BEYOND,
                   warmup if warmup is not None else EXPLORE_WARMUP)

    def warmup_in_force(self, explores: bool) -> int:
        """The warm-up that applies: none where nothing is explored (``explores`` False:
        no draws, or the upstream's answers are not compared; or the rate is 0)."""
        return self.warmup if explores and self.rate > 0 else 0

    def near(self, score: float, threshold: float) -> bool:
        return threshold <= score < threshold + self.width

    def rate_now(self, learned: bool) -> float:
        """The chance a near would-be hit is explored now (what its label is weighted by);
        ``learned``: whether labels of traffic settled the threshold."""
        if self.rate == 0:  # exploration off, even before the labels decide
            return 0.0
        return 1.0 if self.until_learned and not learned else self.rate

    def warming(self, own_over: OwnLabels | None) -> bool:
        """Whether the warm-up is still on: fewer than ``warmup`` of the device's own
        labels (``own_over``; None: no warm-up) score over the threshold, or more of them
        than the rate are wrong."""
        return own_over is not None and (own_over.labels < self.warmup
                                         or not own_over.within_rate)

    def chance(self, score: float, threshold: float, learned: bool = True,
               own_over: OwnLabels | None = None) -> float:
        """The chance this would-be hit is explored now (what its label is weighted by):
        every one while the warm-up is on (``warming`` of the device's own labels over the
        threshold, ``own_over``), then ``rate_now`` near the threshold and ``beyond``
        above the band; none under the threshold, none with exploration off."""
        if score >= threshold and self.rate > 0 and self.warming(own_over):
            return 1.0
        if self.near(score, threshold):
            return self.rate_now(learned)
        return self.beyond if score >= threshold and self.rate > 0 else 0.0

    def explores(self, score: float, threshold: float, rng: random.Random,
                 learned: bool = True, own_over: OwnLabels | None = None) -> bool:
        """Whether this would-be hit is also asked upstream (a draw is made only where the
        chance is over 0, so the seeded sequence depends on those hits alone). ``learned``:
        whether labels of traffic settled ``threshold``; ``own_over``: as ``chance``."""
        chance = self.chance(score, threshold, learned, own_over)
        return chance > 0 and rng.random() < chance
