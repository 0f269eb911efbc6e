"""The global threshold from the round's pooled evidence (shared.fl.evidence), moved only
as far as that evidence supports.

The round's histograms are added up and the F0.5-best threshold on them is the candidate.
The current threshold stays unless the pooled evidence holds at least ``min_pairs`` pairs
(duplicates among them) and the candidate beats it on that evidence; then the threshold
moves toward the candidate by n / (n + prior_pairs) of the way (n pooled pairs, so a
handful of pairs barely moves it and thousands move it almost all the way), by at most
``max_step``, and only if the new value still scores at least the current one on the
pooled evidence. A few small devices with noisy validation sets therefore cannot drag
the threshold, and a threshold the evidence says is worse is never shipped.
"""

from dataclasses import dataclass

import numpy as np
from meancache.shared.fl.evidence import Evidence, edges
from meancache.shared.threshold import nearest_threshold


@dataclass(frozen=True)
class ThresholdRule:
    """Run config: threshold-prior-pairs, threshold-min-pairs, threshold-band."""

    prior_pairs: int  # pooled pairs that weigh as much as the current threshold
    min_pairs: int  # with fewer pooled pairs the threshold stays
    max_step: float  # the most one round may move it


@dataclass(frozen=True)
class Pooled:
    threshold: float  # the new global threshold
    pairs: int  # pooled pairs it rests on
    candidate: float  # the F0.5-best threshold on the pooled pairs
    gain: float  # F0.5 at the candidate minus F0.5 at the current threshold, pooled


def pooled_threshold(current: float, evidence: Evidence, rule: ThresholdRule) -> Pooled:
    n = evidence.pairs
    if n == 0 or evidence.duplicates.sum() == 0:
        return Pooled(current, n, current, 0.0)
    candidates = edges()[edges() > 0]  # a valid threshold is > 0
    scores = evidence.f05(candidates)
    best = int(np.flatnonzero(scores == scores.max())[-1])  # ties: the highest
    at_current = float(evidence.f05(np.array([current]))[0])
    candidate = float(candidates[best])
    gain = float(scores[best]) - at_current
    if n < rule.min_pairs or gain <= 0:
        return Pooled(current, n, candidate, gain)
    step = float(np.clip(n / (n + rule.prior_pairs) * (candidate - current),
                         -rule.max_step, rule.max_step))
    moved = nearest_threshold(current + step)
    if float(evidence.f05(np.array([moved]))[0]) < at_current:
        return Pooled(current, n, candidate, gain)
    return Pooled(moved, n, candidate, gain)
