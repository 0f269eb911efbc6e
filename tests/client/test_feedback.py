"""Feedback: rejected hits become negative pairs and re-tune the local threshold; the
thresholds live in one place that checks every value."""

import math
from collections.abc import Callable

import pytest
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.client.cache.threshold import ThresholdState, set_global_threshold
from meancache.client.device_caches import device_pairs
from meancache.client.matching.labels import labelled_pairs
from meancache.shared.pairs import Pair
from meancache.shared.threshold import DEFAULT_THRESHOLD

CacheFactory = Callable[..., SemanticCache]

FRANCE = "What is the capital of France?"
# Same question, other words: served correctly.
POSITIVES = ["Which city is the capital of France?", "what is france's capital city?"]
# Related but different questions: with a low tau they hit FRANCE, and the user rejects them
# (with verification off: it would veto the swapped name before the user sees it).
NEGATIVES = ["What is the capital of Germany?", "What is the population of France?"]

# With the learned verifier off the learned bound judges by the cosine, and one rejection
# shows its region too wrong at 2% (tests/client/test_learning_cache.py): these tests of
# tau and the entries' own thresholds keep the bound out of their way.
TAU_ALONE = {"verify_hits": False, "max_wrong_rate": 0.99}


def hit(result: Hit | Miss) -> Hit:
    """The result, asserted to be a hit."""
    assert isinstance(result, Hit), f"expected a hit, got {result}"
    return result


def test_reject_records_a_negative_and_waits_for_enough_pairs(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(global_threshold=0.3, tune_min_per_class=2,
                                              **TAU_ALONE))
    entry = cache.insert(FRANCE, "Paris.")
    hit(cache.lookup(POSITIVES[0]))
    wrong = hit(cache.lookup(NEGATIVES[0]))
    assert cache.stats().labelled_positives == 2  # every hit is a (weak) positive
    change = cache.reject(wrong.query, wrong.origin)
    assert not change.changed and change.old == change.new == 0.3
    assert (change.positives, change.negatives) == (1, 1)
    assert "needs 2" in change.reason
    stats = cache.stats()
    assert (stats.labelled_positives, stats.labelled_negatives) == (1, 1)
    assert stats.rejections == 1
    assert stats.local_threshold is None and cache.threshold == 0.3
    assert cache.store.get(entry.id).rejections == 1
    assert "stays" in str(change)


def test_enough_feedback_moves_tau_above_the_false_hits(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(global_threshold=0.3, tune_min_per_class=2,
                                              **TAU_ALONE))
    cache.insert(FRANCE, "Paris.")
    good = [hit(cache.lookup(q)) for q in POSITIVES]
    bad = [hit(cache.lookup(q)) for q in NEGATIVES]
    # The data must allow a clean cut: every correct hit above every wrong one.
    assert min(h.similarity for h in good) > max(h.similarity for h in bad) + 0.05

    first = cache.reject(bad[0].query, bad[0].origin)
    assert not first.changed
    change = cache.reject(bad[1].query, bad[1].origin)
    assert change.changed
    assert (change.old, change.positives, change.negatives) == (0.3, 2, 2)
    assert max(h.similarity for h in bad) < change.new <= min(h.similarity for h in good)
    assert cache.threshold == change.new
    stats = cache.stats()
    assert stats.local_threshold == change.new and stats.threshold == change.new
    assert stats.global_threshold == 0.3
    assert stats.labelled_negatives == 2 and stats.rejections == 2
    assert "->" in str(change)

    for question in NEGATIVES:
        assert isinstance(cache.lookup(question), Miss)
    assert hit(cache.lookup(POSITIVES[1])).matched_query == FRANCE
    cache.close()
    assert make_cache().threshold == change.new  # the local threshold is persisted


def test_rejecting_a_hit_on_a_deleted_entry_still_counts(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(global_threshold=0.3, **TAU_ALONE))
    entry = cache.insert(FRANCE, "Paris.")
    wrong = hit(cache.lookup(NEGATIVES[0]))
    cache.delete(entry.id)
    change = cache.reject(wrong.query, wrong.origin)
    assert not change.changed
    assert cache.stats().labelled_negatives == 1


def test_exact_repeats_teach_nothing_unless_rejected(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(global_threshold=0.3, **TAU_ALONE))
    cache.insert(FRANCE, "Paris.")
    hit(cache.lookup(FRANCE.lower()))  # an exact repeat (up to case): no pair
    hit(cache.lookup(POSITIVES[0]))
    repeat = hit(cache.lookup(f"  {FRANCE} "))
    assert labelled_pairs(cache.store) == [Pair(POSITIVES[0], FRANCE, 1)]
    cache.reject(repeat.query, repeat.origin)  # the cached answer itself was wrong: that teaches
    expected = [Pair(POSITIVES[0], FRANCE, 1), Pair(FRANCE, FRANCE, 0)]
    assert labelled_pairs(cache.store) == expected
    assert labelled_pairs(cache.store, newest=1) == expected[1:]
    stats = cache.stats()
    assert (stats.labelled_positives, stats.labelled_negatives) == (1, 1)
    cache.close()
    # Federated learning trains on exactly these pairs.
    assert device_pairs([cache.store.directory]) == expected
    assert device_pairs([cache.store.directory / "missing"]) == []


@pytest.mark.parametrize("value", [0.0, -0.1, 1.0, 1.5, math.nan, True, "0.5"])
def test_every_threshold_write_checks_its_range(make_cache: CacheFactory, value: float) -> None:
    cache = make_cache()
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        cache.thresholds.set_global(value)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        cache.thresholds.set_local(value)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        set_global_threshold(cache.store.directory, value)
    with pytest.raises(ValueError, match="strictly between 0 and 1"):
        ThresholdState(cache.store, value)
    assert cache.thresholds.global_value == DEFAULT_THRESHOLD
    assert cache.thresholds.local_value is None


def test_global_threshold_set_beside_an_open_cache(make_cache: CacheFactory) -> None:
    """What FL does while the chat holds the cache open: the cache sees it at once."""
    cache = make_cache()
    set_global_threshold(cache.store.directory, 0.75)
    assert cache.threshold == cache.thresholds.global_value == 0.75
    assert cache.stats().global_threshold == 0.75


def test_global_threshold_is_used_until_a_local_one_exists(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(tune_min_per_class=2, **TAU_ALONE))
    cache.insert(FRANCE, "Paris.")
    paraphrase = hit(cache.lookup(POSITIVES[1]))
    assert paraphrase.similarity < 0.97

    cache.thresholds.set_global(0.97)
    assert cache.threshold == cache.thresholds.global_value == 0.97
    assert isinstance(cache.lookup(POSITIVES[1]), Miss)
    cache.thresholds.set_global(0.3)
    assert hit(cache.lookup(POSITIVES[1])).similarity == pytest.approx(paraphrase.similarity)
    cache.close()
    cache = make_cache(settings=CacheSettings(tune_min_per_class=2, **TAU_ALONE))
    assert cache.thresholds.global_value == 0.3  # persisted, wins over the settings' default

    for question in POSITIVES:
        hit(cache.lookup(question))
    for question in NEGATIVES:
        wrong = hit(cache.lookup(question))
        cache.reject(wrong.query, wrong.origin)
    local = cache.stats().local_threshold
    assert local is not None and local > 0.3
    cache.thresholds.set_global(0.5)
    assert cache.thresholds.global_value == 0.5
    assert cache.threshold == local  # the device's own tuning takes precedence
