"""Threshold math: F0.5-optimal thresholds, brute-force agreement, ties, transfer."""

import numpy as np
import pytest
from meancache.shared.threshold import best_threshold, score_thresholds, transfer_threshold


def test_best_threshold_on_hand_made_pairs() -> None:
    """Cuts (tp, fp, fn): .95 -> (1,0,2) F=.714; .9 -> (2,0,1) F=10/11; .8 -> (2,1,1) F=.667;
    .7 -> (3,1,0) F=.789; .3 -> (3,2,0) F=.652. The best cut lies between 0.9 and 0.8."""
    sims = np.array([0.95, 0.9, 0.8, 0.7, 0.3])
    labels = np.array([1, 1, 0, 1, 0])
    best = best_threshold(sims, labels)
    assert best.threshold == pytest.approx(0.85)
    assert best.precision == pytest.approx(1.0)
    assert best.recall == pytest.approx(2 / 3)
    assert best.f05 == pytest.approx(10 / 11)
    assert best.f1 == pytest.approx(0.8)
    assert best.accuracy == pytest.approx(4 / 5)
    assert best.pairs == 5


def test_best_threshold_ignores_input_order() -> None:
    sims = np.array([0.95, 0.9, 0.8, 0.7, 0.3])
    labels = np.array([1, 1, 0, 1, 0])
    order = np.array([3, 0, 4, 2, 1])
    assert best_threshold(sims[order], labels[order]) == best_threshold(sims, labels)


@pytest.mark.parametrize("seed", range(5))
def test_best_threshold_agrees_with_brute_force_sweep(seed: int) -> None:
    """Every cut of the data is a candidate; the best one must reach the sweep's maximum."""
    rng = np.random.default_rng(seed)
    sims = rng.integers(0, 25, size=60) / 25  # coarse values: many ties
    labels = (rng.random(60) < sims).astype(int)  # duplicates tend to score higher
    best = best_threshold(sims, labels)

    distinct = np.unique(sims)
    candidates = np.r_[distinct, (distinct[1:] + distinct[:-1]) / 2, distinct.max() + 0.01]
    sweep = score_thresholds(sims, labels, candidates)
    top = max(s.f05 for s in sweep)
    assert best.f05 == pytest.approx(top)
    # The reported scores are those of the reported threshold.
    assert score_thresholds(sims, labels, np.array([best.threshold]))[0] == best
    # Ties go to the higher threshold: no optimal cut predicts fewer duplicates.
    fewest = min(int((sims >= s.threshold).sum()) for s in sweep if s.f05 == pytest.approx(top))
    assert int((sims >= best.threshold).sum()) == fewest


def test_ties_prefer_the_higher_threshold() -> None:
    """Cut after 0.85: P=1, R=1/2, F0.5=5/6; cut after 0.5: P=4/5, R=1, F0.5=5/6."""
    sims = np.array([0.9, 0.85, 0.6, 0.55, 0.5])
    labels = np.array([1, 1, 0, 1, 1])
    high, low = score_thresholds(sims, labels, np.array([0.725, 0.4]))
    assert high.f05 == pytest.approx(5 / 6) and low.f05 == pytest.approx(5 / 6)
    best = best_threshold(sims, labels)
    assert best.threshold == pytest.approx(0.725)
    assert best.recall == pytest.approx(0.5)


def test_no_duplicates_means_a_threshold_above_every_pair() -> None:
    sims = np.array([0.9, 0.5, 0.2])
    best = best_threshold(sims, np.zeros(3, dtype=int))
    assert best.threshold > sims.max()
    assert best.accuracy == pytest.approx(1.0)


def test_only_duplicates_means_a_threshold_below_every_pair() -> None:
    sims = np.array([0.9, 0.5, 0.2])
    best = best_threshold(sims, np.ones(3, dtype=int))
    assert best.threshold < sims.min()
    assert best.recall == pytest.approx(1.0)
    assert best.precision == pytest.approx(1.0)


def test_best_threshold_rejects_empty_input() -> None:
    with pytest.raises(ValueError):
        best_threshold(np.array([]), np.array([]))


def test_score_thresholds_rejects_mismatched_lengths() -> None:
    with pytest.raises(ValueError):
        score_thresholds(np.array([0.1, 0.2]), np.array([1]), np.array([0.5]))


def test_score_thresholds_counts() -> None:
    sims = np.array([0.9, 0.7, 0.6, 0.2])
    labels = np.array([1, 0, 1, 0])
    (s,) = score_thresholds(sims, labels, np.array([0.65]))
    # predicted duplicates: 0.9 (tp) and 0.7 (fp); missed: 0.6 (fn); 0.2 (tn)
    assert (s.precision, s.recall, s.accuracy) == pytest.approx((0.5, 0.5, 0.5))
    assert s.as_dict()["pairs"] == 4


def test_transfer_threshold_identity_space_keeps_the_threshold() -> None:
    sims = np.linspace(0.5, 1.0, 50)
    assert transfer_threshold(0.8, sims, sims) == pytest.approx(0.8)


def test_transfer_threshold_follows_a_linear_map() -> None:
    sims_from = np.linspace(0.6, 1.0, 60)
    sims_to = 0.5 * sims_from + 0.3
    assert transfer_threshold(0.8, sims_from, sims_to) == pytest.approx(0.7)


def test_transfer_threshold_without_spread_keeps_the_threshold() -> None:
    assert transfer_threshold(0.8, np.full(30, 0.7), np.linspace(0, 1, 30)) == 0.8
    assert transfer_threshold(0.8, np.array([0.7]), np.array([0.2])) == 0.8
