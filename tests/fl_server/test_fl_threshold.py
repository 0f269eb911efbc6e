"""The global threshold from pooled similarity evidence (shared.fl.evidence,
fl_server.pooled_threshold): small noisy devices do not drag it, large consistent evidence
moves it, and screening bounds what one device's evidence can do."""

import numpy as np
import pytest
from meancache.fl_server.pooled_threshold import ThresholdRule, pooled_threshold
from meancache.shared.fl.evidence import BINS, DUPLICATES, Evidence
from meancache.shared.threshold import best_threshold

RULE = ThresholdRule(prior_pairs=500, min_pairs=50, max_step=0.05)
CURRENT = 0.869


def sample(center: float, pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Labelled similarities whose F0.5-best threshold lies near ``center``: a third
    duplicates above it, the rest distinct pairs mostly below."""
    rng = np.random.default_rng(seed)
    labels = rng.random(pairs) < 1 / 3
    sims = np.where(labels, rng.normal(center + 0.05, 0.04, pairs),
                    rng.normal(center - 0.08, 0.06, pairs))
    return np.clip(sims, -1, 1), labels


def evidence(center: float, pairs: int, seed: int) -> Evidence:
    return Evidence.of_pairs(*sample(center, pairs, seed))


def test_a_few_noisy_pairs_do_not_drag_the_threshold() -> None:
    # Two devices with 20 validation pairs each, whose own best thresholds are far off
    # (what the point-estimate mean used to average into the global value).
    devices = [sample(0.76, 20, seed) for seed in (1, 2)]
    own = [best_threshold(sims, labels).threshold for sims, labels in devices]
    assert np.mean(own) < CURRENT - 0.05
    pooled = sum((Evidence.of_pairs(*d) for d in devices), Evidence.empty())
    assert pooled_threshold(CURRENT, pooled, RULE).threshold == CURRENT  # < min_pairs
    moved = pooled_threshold(CURRENT, pooled, ThresholdRule(500, 10, 0.05)).threshold
    assert CURRENT - 40 / 540 * 0.15 <= moved <= CURRENT  # 40 pairs move it a little


def test_large_consistent_evidence_moves_it() -> None:
    pooled = sum((evidence(0.80, 500, seed) for seed in range(4)), Evidence.empty())
    result = pooled_threshold(CURRENT, pooled, RULE)
    assert result.pairs == 2000 and abs(result.candidate - 0.80) < 0.03
    assert CURRENT - RULE.max_step <= result.threshold < CURRENT - 0.03  # one step at most
    scores = pooled.f05(np.array([CURRENT, result.threshold]))
    assert scores[1] > scores[0]
    # Without the step limit it goes n / (n + prior) = 80% of the way.
    free = pooled_threshold(CURRENT, pooled, ThresholdRule(500, 50, 1.0))
    assert free.threshold == pytest.approx(CURRENT + 0.8 * (free.candidate - CURRENT), abs=1e-6)


def test_evidence_that_favours_the_current_threshold_keeps_it() -> None:
    pooled = evidence(0.8, 2000, 5)
    best = pooled_threshold(CURRENT, pooled, RULE).candidate
    assert pooled_threshold(best, pooled, RULE).threshold == best
    assert pooled_threshold(CURRENT, Evidence.empty(), RULE).threshold == CURRENT


def test_evidence_travels_as_counts_and_is_scaled_down_whole() -> None:
    sims, labels = sample(0.8, 300, 3)
    sent = Evidence.of_pairs(sims, labels)
    back = Evidence.from_metrics(sent.to_metrics())
    assert back.pairs == 300 and int(back.duplicates.sum()) == int(labels.sum())
    assert all(isinstance(v, int) for v in sent.to_metrics()[DUPLICATES])
    half = back.at_most(150)
    assert half.pairs == 150 and (half.duplicates <= back.duplicates).all()
    assert abs(int(half.duplicates.sum()) - int(labels.sum()) / 2) <= 1


@pytest.mark.parametrize(("metrics", "reason"), [
    ({}, "must be a list of 400 counts"),
    ({DUPLICATES: [0] * (BINS - 1)}, "must be a list of 400 counts"),
    ({DUPLICATES: [-1] + [0] * (BINS - 1)}, "whole numbers >= 0"),
    ({DUPLICATES: [0.5] + [0] * (BINS - 1)}, "whole numbers >= 0"),
    ({DUPLICATES: [float("nan")] + [0] * (BINS - 1)}, "whole numbers >= 0"),
])
def test_malformed_evidence_is_refused_with_its_reason(metrics: dict[str, object],
                                                       reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        Evidence.from_metrics({**Evidence.empty().to_metrics(), **metrics}
                              if metrics else {})
