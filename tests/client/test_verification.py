"""The rule verifier (``verifier = "rules"``): a candidate at or above tau that only looks
like the query is vetoed (the lookup misses and says why), a paraphrase is served, and the
setting turns verification off. Cache tests run the real MiniLM on a real on-disk cache."""

import json
from pathlib import Path

import pytest
from meancache.client.cache import CacheSettings, Hit, Miss
from meancache.client.config import load_settings
from meancache.client.matching.question import embed_texts
from meancache.client.matching.rules import CHECKS, WITH_LEARNED, verify
from meancache.shared.encoder import Encoder
from meancache.shared.verifier import negatives

from tests.conftest import CacheFactory
from tests.support.paths import TEST_DATA

NEAR_MISS_FILE = TEST_DATA / "near_miss.jsonl"
FRANCE = "What is the capital of France?"
RULES = CacheSettings(verifier="rules")


@pytest.mark.parametrize(("cached", "asked", "kind"), [
    (FRANCE, "What isn't the capital of France?", "negation"),
    ("How do I make bread with yeast?", "How do I make bread without yeast?", "negation"),
    ("How many calories are in 100 grams of rice?",
     "How many calories are in 200 grams of rice?", "number"),
    ("How much is 100 dollars in euros?", "How much is 100 dollars in rupees?", "unit"),
    (FRANCE, "What is the capital of Germany?", "entity"),
    ("what is the capital of france", "What is the capital of Germany?", "entity"),
    ("How do I convert USD to EUR?", "How do I convert EUR to USD?", "direction"),
    ("Is Python faster than Java?", "Is Java faster than Python?", "direction"),
    ("What is the largest ocean on Earth?", "What is the smallest ocean on Earth?", "antonym"),
    ("What is the weather in London today?", "What is the weather in London tomorrow?",
     "time"),
])
def test_look_alikes_are_vetoed_with_the_kind_named(cached: str, asked: str, kind: str) -> None:
    veto = verify(asked, cached)
    assert veto is not None and veto.kind == kind
    assert veto.reason.startswith(f"a cached question looked alike but differs in {kind}")


@pytest.mark.parametrize(("cached", "asked"), [
    (FRANCE, "What's the capital city of France?"),
    ("Why can't I sleep at night?", "Why am I unable to fall asleep at night?"),
    ("How many calories are in 100 grams of rice?", "How many calories does 100g of rice have?"),
    ("How much is 100 dollars in euros?", "What is 100 USD in euros?"),
    ("What is the distance from Paris to Berlin?", "How far is Berlin from Paris?"),
    ("Which is better, iPhone or Android?", "Which is better: Android or iPhone?"),
    ("What Is The Best Way To Learn Coding", "What is the easiest way to learn coding?"),
    ("How can I make money through Android Application?",
     "How can I make money from Android applications?"),
])
def test_paraphrases_pass(cached: str, asked: str) -> None:
    assert verify(asked, cached) is None


def test_only_the_chosen_checks_run() -> None:
    """The learned verifier keeps only some checks (``WITH_LEARNED``): the others say
    nothing, whatever they would have found."""
    negated = ("What isn't the capital of France?", FRANCE)
    swapped = ("Is Java faster than Python?", "Is Python faster than Java?")
    assert set(WITH_LEARNED) < set(CHECKS) and "negation" not in WITH_LEARNED
    assert verify(*negated, WITH_LEARNED) is None
    assert getattr(verify(*negated, ("negation",)), "kind", None) == "negation"
    assert getattr(verify(*swapped, WITH_LEARNED), "kind", None) == "direction"
    assert verify(*swapped, ()) is None


@pytest.mark.parametrize(("cached", "asked", "vetoed"), [
    ("What is the distance from London to Paris?", "What is the distance from Paris to London?",
     False),
    ("How many miles from Chicago to Detroit?", "How many miles from Detroit to Chicago?", False),
    ("How far is it from Lyon to Nice by car?", "How far is it from Nice to Lyon by car?", False),
    # a conversion is not a distance's two ends, nor a trip
    ("How far is 10 km in miles?", "How far is 10 miles in km?", True),
    ("How long is the flight from London to New York?",
     "How long is the flight from New York to London?", True),
    ("How do I move photos from my phone to my PC?", "How do I move photos from my PC to my phone?",
     True),
])
def test_a_distance_is_the_same_from_either_end(cached: str, asked: str, vetoed: bool) -> None:
    """The kept direction check vetoes a reversed trip or transfer, not a reversed distance,
    which the code-made training data labels the same question (negatives.symmetric_direction)."""
    assert (verify(asked, cached, WITH_LEARNED) is not None) is vetoed
    if not vetoed:
        assert negatives.symmetric_direction(cached) == asked


def test_an_unknown_check_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="no verification check named colour; the checks "
                                         "are negation, antonym, number"):
        verify(FRANCE, FRANCE, ("colour", "negation"))


def test_the_near_miss_set_is_labelled_and_spread_over_every_kind() -> None:
    rows = [json.loads(line) for line in NEAR_MISS_FILE.read_text("utf-8").splitlines()]
    near = [r for r in rows if r["label"] == 0]
    kinds = {r["kind"] for r in near}
    assert len(near) >= 150 and len(rows) - len(near) >= len(near)
    assert kinds == {"negation", "antonym", "entity", "number", "unit", "direction", "time",
                     "place"}
    assert all(r["kind"] == "paraphrase" for r in rows if r["label"] == 1)


def similarity(encoder: Encoder, a: str, b: str) -> float:
    vectors = embed_texts(encoder, [a, b])  # as the matcher embeds questions
    return float(vectors[0] @ vectors[1])


@pytest.mark.parametrize(("asked", "kind", "tau"), [
    ("What isn't the capital of France?", "negation", None),
    ("What is the capital of Germany?", "entity", 0.45),  # a swapped name scores 0.47
])
def test_a_vetoed_candidate_is_a_miss_that_says_why(
    make_cache: CacheFactory, encoder: Encoder, asked: str, kind: str, tau: float | None
) -> None:
    cache = make_cache(settings=CacheSettings(global_threshold=tau or RULES.global_threshold,
                                              verifier="rules"))
    cache.insert(FRANCE, "Paris.")
    result = cache.lookup(asked)
    assert isinstance(result, Miss)
    assert result.best_similarity is not None and result.best_similarity >= cache.threshold
    assert result.reason.startswith(f"a cached question looked alike but differs in {kind}")
    assert cache.stats().misses == 1 and cache.stats().hits == 0


def test_a_paraphrase_is_still_served(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=RULES)
    cache.insert("How many calories are in 100 grams of rice?", "About 130 kcal.")
    result = cache.lookup("How many calories does 100g of rice have?")
    assert isinstance(result, Hit) and result.answer == "About 130 kcal."


def test_a_vetoed_best_candidate_is_a_miss_not_a_reason_to_serve_the_next_one(
    make_cache: CacheFactory, encoder: Encoder
) -> None:
    """The verifier's veto ends the lookup (as in vLLM Semantic Router): a lower candidate
    that was never verified against the look-alike is not served in its place."""
    asked = "Is Python faster than Java?"
    reversed_, paraphrase = "Is Java faster than Python?", "Does Python run faster than Java?"
    cache = make_cache(settings=RULES)
    cache.insert(reversed_, "Python is usually slower than Java.")
    cache.insert(paraphrase, "No: Java is usually faster than Python.")
    assert similarity(encoder, asked, reversed_) > similarity(encoder, asked, paraphrase) \
        >= cache.threshold  # the look-alike is the nearest candidate
    result = cache.lookup(asked)
    assert isinstance(result, Miss)
    assert result.reason.startswith("a cached question looked alike but differs in direction")


def test_the_setting_turns_verification_off(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(verify_hits=False))
    cache.insert(FRANCE, "Paris.")
    result = cache.lookup("What isn't the capital of France?")
    assert isinstance(result, Hit) and result.answer == "Paris."


def test_verification_is_on_by_default_and_configurable(tmp_path: Path) -> None:
    assert load_settings(config_dir=tmp_path, environ={}).cache_settings().verify_hits
    off = load_settings(config_dir=tmp_path, environ={"MEANCACHE_VERIFY_HITS": "off"})
    assert not off.cache_settings().verify_hits
