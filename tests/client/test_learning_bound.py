"""The error bound: Clopper–Pearson limits that cover the observed rate, a threshold that
starts at the prior, falls only where the labels back it at the bound, and rises past
every score where they show the prior's region too wrong; an entry's own wrong labels
only ever tighten its threshold."""

import random
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from meancache.client.learning.bound import (
    NEVER,
    USER,
    Label,
    Rows,
    choose,
    choose_pooled,
    entry_threshold,
    labels_needed,
    labels_to_pass,
    lower_limit,
    upper_limit,
)
from meancache.shared.fl.bound_evidence import BINS, BoundEvidence

PRIOR = 0.556


@given(st.integers(0, 400), st.integers(1, 400), st.sampled_from([0.9, 0.95, 0.99]))
def test_limits_bracket_the_observed_rate(errors: int, extra: int, confidence: float) -> None:
    n = errors + extra
    assert lower_limit(errors, n, confidence) <= errors / n <= upper_limit(errors, n, confidence)


def test_no_errors_needs_about_150_labels_for_two_percent() -> None:
    # (1 - 0.02)^n <= 0.05  <=>  n >= 149: the exact binomial arithmetic
    assert upper_limit(0, 148) > 0.02 >= upper_limit(0, 149)


@given(st.floats(0.005, 0.2), st.sampled_from([0.9, 0.95, 0.99]))
def test_no_pooling_of_fewer_labels_than_needed_can_pass(rate: float, confidence: float
                                                         ) -> None:
    """The floor of how soon the bound can learn: with ``labels_needed`` right labels the
    upper limit reaches the rate, with one fewer it cannot, and ``choose`` never learns
    from fewer, however the labels' scores fall (all right, spread over one region)."""
    needed = labels_needed(rate, confidence)
    assert upper_limit(0, needed, confidence) <= rate < upper_limit(0, needed - 1, confidence)
    scores = [0.2 + 0.3 * i / needed for i in range(needed)]
    fewer = [Label(s, False) for s in scores[1:]]
    assert not choose(fewer, rate, PRIOR, confidence).learned
    assert choose([Label(s, False) for s in scores], rate, PRIOR, confidence).threshold \
        == pytest.approx(0.2)


def test_without_labels_the_prior_decides() -> None:
    bound = choose([], 0.02, PRIOR)
    assert (bound.threshold, bound.learned, bound.labels) == (PRIOR, False, 0)


def test_many_right_labels_below_the_prior_lower_the_threshold() -> None:
    labels = [Label(0.3 + 0.2 * i / 300, False) for i in range(300)]
    bound = choose(labels, 0.02, PRIOR)
    assert bound.learned and bound.threshold < PRIOR
    assert bound.upper is not None and bound.upper <= 0.02


def test_fixed_sequence_stops_at_the_first_failure() -> None:
    right = [Label(0.9 - 0.3 * i / 300, False) for i in range(300)]  # 0.6 .. 0.9
    wrong_band = [Label(0.5, True) for _ in range(20)]
    below = [Label(0.2 - 0.1 * i / 500, False) for i in range(500)]  # right again, lower
    bound = choose(right + wrong_band + below, 0.02, PRIOR)
    assert bound.threshold > 0.5  # never past the wrong band, however right below it


def test_a_later_start_tests_the_large_regions_under_a_small_wrong_top() -> None:
    """A top region of 190 labels, 2 wrong (upper limit 3.3%), over 600 right ones: the
    sequence starting at the first tail of 149 labels tests the top first and stops; one
    starting where a region wrong at half the rate can pass tests the large tails."""
    top = [Label(0.99, i < 2) for i in range(190)]
    under = [Label(0.95 - 0.2 * i / 600, False) for i in range(600)]
    assert not choose(top + under, 0.02, PRIOR).learned
    start = labels_to_pass(0.01, 0.02)
    bound = choose(top + under, 0.02, PRIOR, start=start)
    assert bound.learned and bound.threshold == pytest.approx(0.75 + 0.2 / 600)
    assert bound.upper is not None and bound.upper <= 0.02
    assert bound.labels == 790 and bound.estimate == pytest.approx(2 / 790)


@given(st.floats(0, 0.049), st.sampled_from([0.02, 0.05, 0.1]), st.sampled_from([0.9, 0.95]))
def test_labels_to_pass_is_the_fewest_at_that_share(fraction: float, rate: float,
                                                     confidence: float) -> None:
    share = fraction * rate / 0.05  # under the rate
    n = labels_to_pass(share, rate, confidence)
    assert upper_limit(share * n, n, confidence) <= rate
    assert n == 1 or upper_limit(share * (n - 1), n - 1, confidence) > rate
    assert n >= labels_needed(rate, confidence)


def test_a_wrong_prior_region_serves_nothing() -> None:
    labels = [Label(0.8, i % 3 == 0) for i in range(60)]  # a third wrong over the prior
    assert choose(labels, 0.02, PRIOR).threshold == NEVER


def test_a_closed_bound_says_which_labels_closed_it() -> None:
    """A judge without a prior (the learned decision's card's) whose labels back no
    region: the bound is closed, and it carries the numbers of the region whose test
    failed first (the highest-scoring labels_needed of them), not "nothing estimated"."""
    needed = labels_needed(0.02)
    labels = [Label(1.0 - i / 1000, i % 20 == 0) for i in range(400)]  # 5% wrong throughout
    bound = choose(labels, 0.02, NEVER)
    first = labels[:needed]
    wrong = sum(label.wrong for label in first)
    assert bound.closed and not bound.learned and bound.lower is None
    assert bound.labels == needed and bound.estimate == pytest.approx(wrong / needed)
    assert bound.upper == pytest.approx(upper_limit(wrong, needed)) and bound.upper > 0.02
    assert not choose([], 0.02, NEVER).estimate  # no labels: nothing to show


def test_own_labels_refusing_the_cards_region_say_how_wrong_it_is() -> None:
    """The card's labels (pooled rows, no prior) open a region; this device's labels over
    it, a fifth of them wrong, refuse it: the bound is closed and carries their share and
    their lower limit, which is over the rate."""
    card = _pooled([Label(0.5 + 0.5 * i / 5_000, i % 200 == 0) for i in range(5_000)])
    opened = choose_pooled([], [], card, 0.02, NEVER, start=labels_to_pass(0.01, 0.02))
    assert opened.learned
    own = [Label(opened.threshold + 0.001 * (i % 10), i % 5 == 0) for i in range(100)]
    bound = choose_pooled(own, own, card, 0.02, NEVER, start=labels_to_pass(0.01, 0.02))
    assert bound.closed and bound.labels == 100 and bound.estimate == pytest.approx(0.2)
    assert bound.lower == pytest.approx(lower_limit(20, 100)) and bound.lower > 0.02


def test_a_users_wrong_answer_alone_never_closes_the_cache() -> None:
    """Presses are no sample of the served answers (a user presses on wrong ones only):
    any number of them over the prior's region leave it open, and over the card's region
    they do not refuse it; the same labels drawn as compared misses close both. Where a
    region is tested to pass they still count as errors."""
    presses = [Label(0.91 + i / 1000, True, source=USER) for i in range(5)]
    sampled = [replace(label, source="miss") for label in presses]
    assert choose(presses, 0.02, PRIOR).threshold == PRIOR
    assert choose(sampled, 0.02, PRIOR).closed
    card = _pooled([Label(0.5 + 0.5 * i / 5_000, False) for i in range(5_000)])
    start = labels_to_pass(0.01, 0.02)
    assert not choose_pooled(presses, presses, card, 0.02, NEVER, start=start).closed
    assert choose_pooled(sampled, sampled, card, 0.02, NEVER, start=start).closed
    right = [Label(0.9 + i / 10_000, False) for i in range(200)]
    assert choose(right, 0.02, PRIOR).learned
    assert not choose(right + presses * 4, 0.02, PRIOR).learned  # 20 errors in 220


def test_sparse_exploration_labels_weigh_more() -> None:
    """Ten wrong explored labels (each one of ten like it) count as a hundred."""
    right = [Label(0.7, False) for _ in range(400)]
    explored = [Label(0.7, True, labelled_with=0.1, source="explore") for _ in range(10)]
    assert choose(right, 0.02, PRIOR).learned
    assert not choose(right + explored, 0.02, PRIOR).learned


@pytest.mark.parametrize("rate", [0, 1, -0.1, 2])
def test_a_rate_outside_zero_one_is_refused(rate: float) -> None:
    with pytest.raises(ValueError, match="max_wrong_rate"):
        choose([Label(0.5, False)], rate, PRIOR)


def _fixed_sequence(labels: list[Label], rate: float, confidence: float,
                    start: int | None = None) -> tuple[float, float] | None:
    """Learn-then-Test written out row by row (distinct scores): for each score from the
    top, the tail's weighted error and Kish's effective count, its upper limit inverted;
    the sequence starts at the first tail with enough labels and stops at its first
    failure. The threshold and upper limit it reaches, or None."""
    labels = sorted(labels, key=lambda label: -label.score)
    w = np.array([1 / label.labelled_with for label in labels])
    x = np.array([label.wrong for label in labels], dtype=float)
    total, squares, errors = np.cumsum(w), np.cumsum(w ** 2), np.cumsum(w * x)
    passed, started = None, False
    for i, label in enumerate(labels):
        if i + 1 < len(labels) and labels[i + 1].score == label.score:
            continue  # the tail of a score holds every label at that score
        n = total[i] ** 2 / squares[i]
        started = started or n >= max(labels_needed(rate, confidence), start or 0)
        if started:
            upper = upper_limit(errors[i] / total[i] * n, n, confidence)
            if upper > rate:
                break
            passed = label.score, upper
    return passed


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([20, 150, 400, 1000, 2000]),
       st.floats(0, 0.1),
       st.integers(0, 40), st.sampled_from([0.02, 0.05, 0.1]), st.sampled_from([0.9, 0.95]),
       st.sampled_from([None, 300]))
def test_the_threshold_is_the_one_learn_then_test_reaches_row_by_row(
        seed: int, count: int, wrong_share: float, grid: int, rate: float,
        confidence: float, start: int | None) -> None:
    """``choose`` tests the rows without inverting the Beta distribution, in blocks, and
    stops early; it must reach the threshold, and report the upper limit, that inverting
    it for every tail reaches. Scores continuous or on a grid (ties, ``grid`` 1 to 40),
    wrong more often the lower they score (so the sequence may stop deep down), a fifth of
    the labels explored (weighted); the sequence starting where ``choose`` starts it
    or at a later tail (``start``)."""
    rng = random.Random(seed)
    labels = []
    for _ in range(count):
        score = rng.random() if not grid else rng.randrange(grid + 1) / grid
        labels.append(Label(score, rng.random() < wrong_share * 3 * (1 - score) ** 2,
                            labelled_with=rng.choice([1.0, 1.0, 1.0, 1.0, 0.1])))
    bound = choose(labels, rate, PRIOR, confidence, start)
    expected = _fixed_sequence(labels, rate, confidence, start)
    assert bound.learned == (expected is not None)
    if expected is not None:
        assert bound.threshold == expected[0]
        assert bound.upper == pytest.approx(expected[1], rel=1e-9)


def test_the_bound_holds_on_random_streams() -> None:
    """Scores from a calibrated judge (P(wrong) = 1 - score): the chosen threshold's true
    wrong share stays under the bound in (nearly) every draw."""
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    broken = 0
    for _ in range(20):
        labels = []
        for _ in range(1500):
            score = rng.random()
            labels.append(Label(score, rng.random() < (1 - score) * 0.2))
        bound = choose(labels, 0.02, PRIOR)
        # true wrong share over [t, 1] of a uniform score with P(wrong) = 0.2 (1 - s)
        t = min(bound.threshold, 1.0)
        true = 0.2 * (1 - t) / 2
        broken += true > 0.02
    assert broken <= 3  # 95% confidence: about one in twenty may break


@given(st.lists(st.tuples(st.floats(0, 1), st.booleans()), max_size=20),
       st.floats(0, 1))
def test_an_entry_is_never_looser_than_the_global_threshold(
        own: list[tuple[float, bool]], global_threshold: float) -> None:
    labels = [Label(score, wrong, entry="e") for score, wrong in own]
    assert entry_threshold(global_threshold, labels) >= global_threshold


def test_one_user_rejection_raises_the_entry_at_once() -> None:
    label = Label(0.8, True, entry="e", source=USER)
    assert entry_threshold(0.5, [label]) > 0.8
    assert entry_threshold(0.5, [Label(0.8, True, entry="e")]) == 0.5  # one miss label: not yet


# evidence pooled by federated learning -------------------------------------------------
def _pooled(labels: list[Label]) -> Rows:
    """``labels`` as they reach another device: binned sums (shared.fl.bound_evidence),
    the bins of several devices added up."""
    evidence = BoundEvidence.empty()
    for device in range(3):
        mine = labels[device::3]
        evidence = evidence + BoundEvidence.of_labels(
            np.array([label.score for label in mine]),
            np.array([label.wrong for label in mine], dtype=float),
            np.array([1 / label.labelled_with for label in mine]))
    return Rows.pooled_bins(*evidence.rows())


@given(st.lists(st.tuples(st.integers(0, BINS - 1), st.booleans(),
                          st.sampled_from([1.0, 0.5, 0.25, 0.125])), min_size=1, max_size=600),
       st.lists(st.tuples(st.integers(0, BINS - 1), st.sampled_from([1.0, 0.5, 0.25])),
                max_size=300),
       st.sampled_from([0.02, 0.05, 0.1]), st.sampled_from([0.25, 0.556, 0.9]))
@settings(max_examples=60, deadline=None)
def test_pooled_and_own_labels_bound_as_all_of_them_on_one_device(
        pooled: list[tuple[int, bool, float]], own_right: list[tuple[int, float]],
        rate: float, prior: float) -> None:
    """The merge is exact: labels at bin edges with dyadic weights (so every sum is exact
    in floating point), some pooled from other devices and the rest this device's own,
    give the bound all of them give on one device. (Own labels all right, so the own
    guard has nothing to refuse: the next test is about it.)"""
    others = [Label(k / BINS, wrong, labelled_with) for k, wrong, labelled_with in pooled]
    own = [Label(k / BINS, False, labelled_with) for k, labelled_with in own_right]
    merged = choose_pooled(own, own, _pooled(others), rate, prior)
    alone = choose(own + others, rate, prior)
    assert replace(merged, pooled=0) == alone
    if merged.learned:
        assert merged.pooled == sum(label.score >= merged.threshold for label in others)


def test_pooled_right_labels_teach_a_device_without_labels() -> None:
    pooled = _pooled([Label(0.25 + 0.5 * i / 400, False) for i in range(400)])
    bound = choose_pooled([], [], pooled, 0.02, PRIOR)
    assert bound.learned and bound.threshold < PRIOR and bound.pooled == bound.labels > 0


def test_own_labels_showing_the_region_too_wrong_refuse_the_pool() -> None:
    """Another traffic: 20,000 right labels pooled from elsewhere, enough to drown this
    device's 100 over the same region of which a tenth were wrong, which alone show that
    region too wrong (lower limit above 2%): its own bound stands (the prior's region
    closed), not the pool's."""
    pooled = _pooled([Label(0.5 + 0.5 * i / 20_000, False) for i in range(20_000)])
    own = [Label(0.8, i % 10 == 0) for i in range(100)]
    together = choose(own + [Label(0.5 + 0.5 * i / 20_000, False) for i in range(20_000)],
                      0.02, PRIOR)
    assert together.learned and together.threshold < 0.8  # what pooling alone would do
    assert lower_limit(10, 100) > 0.02
    assert choose_pooled(own, own, pooled, 0.02, PRIOR) == choose(own, 0.02, PRIOR)
    assert choose(own, 0.02, PRIOR).threshold == NEVER
