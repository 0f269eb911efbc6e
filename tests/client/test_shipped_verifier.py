"""The shipped verifier in the real cache (MiniLM, ``verifier = "learned"``), on a few questions
written for this test: the candidate served is the one the verifier judges the same
question, not the most similar one; a veto is a miss that says so, and so are two
candidates that both pass (which one is meant is a guess).

These examples exercise the wiring with the real model; its quality is measured on
held-out data by benchmarks/verification.py (QQP dev-b, the near-miss set), where its
known misses are reported too (a trade of names around "than" or "to" is still often
judged the same question)."""

from collections.abc import Callable
from dataclasses import replace

import pytest
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.client.matching.question import embed_texts
from meancache.shared.encoder import Encoder
from meancache.shared.verifier.runtime import LearnedVerifier

CacheFactory = Callable[..., SemanticCache]
LEARNED = CacheSettings(verifier="learned")
# The rules decision around the verifier (the threshold, the ambiguity rule, the kept
# checks), whose mechanics the tests below name; the learned one: test_learned_decision.py
RULED = CacheSettings(verifier="learned", decision="rules")
# (asked, a look-alike that needs another answer, a paraphrase): the look-alike is the
# more similar of the two in MiniLM's space
TRIPLES = [
    ("How do I learn Python quickly?", "How do I not learn Python quickly?",
     "What is the fastest way to learn Python?"),
    ("What is the best way to lose weight?", "What is the worst way to lose weight?",
     "How can I lose weight effectively?"),
]


def test_the_shipped_verifier_loads_with_its_hash_and_a_probability_threshold() -> None:
    verifier = LearnedVerifier.load()
    assert 0 < verifier.threshold < 1
    assert verifier.path.stat().st_size <= 25 * 1024 * 1024


def test_a_paraphrase_is_served_and_a_look_alike_is_a_miss_that_says_why(
        make_cache: CacheFactory) -> None:
    cache = make_cache(settings=LEARNED)
    cache.insert("Which city is the capital of France?", "Paris")
    hit = cache.lookup("What is the capital of France?")
    assert isinstance(hit, Hit) and hit.answer == "Paris"
    miss = cache.lookup("What isn't the capital of France?")
    assert isinstance(miss, Miss)
    assert miss.reason.startswith("the verifier judged it a different question (p=0.")


@pytest.mark.parametrize(("asked", "look_alike", "paraphrase"), TRIPLES)
def test_the_verified_candidate_is_served_not_the_most_similar(
        make_cache: CacheFactory, encoder: Encoder, asked: str, look_alike: str,
        paraphrase: str) -> None:
    a, near, same = embed_texts(encoder, [asked, look_alike, paraphrase])
    cache = make_cache(settings=LEARNED)
    assert float(a @ near) > float(a @ same) >= cache.matcher.recall_tau  # both offered
    cache.insert(look_alike, "the look-alike's answer")
    cache.insert(paraphrase, "the paraphrase's answer")
    hit = cache.lookup(asked)
    assert isinstance(hit, Hit) and hit.answer == "the paraphrase's answer"


def test_a_swapped_direction_the_model_misses_is_vetoed_by_the_kept_rule_as_a_miss(
        make_cache: CacheFactory, encoder: Encoder) -> None:
    """The model judges "Is coffee healthier than tea?" the same question as "Is tea
    healthier than coffee?"; the direction check kept beside it vetoes it, and the lower
    candidate is not served instead (the threshold here lies between the two)."""
    asked, swapped, other = ("Is tea healthier than coffee?", "Is coffee healthier than tea?",
                             "Is tea cheaper than coffee?")
    shipped = LearnedVerifier.load()
    swapped_p, other_p = shipped.probabilities(asked, [swapped, other])
    assert swapped_p >= shipped.threshold and swapped_p > other_p  # the model's miss
    between = float(swapped_p + other_p) / 2
    passing = LearnedVerifier(shipped.path, replace(shipped.card, threshold=between))
    cache = make_cache(settings=RULED.model_copy(update={"global_threshold": 0.3,
                                                          "recall_margin": 0.0}),
                       verifier=passing)
    a, b, c = embed_texts(encoder, [asked, swapped, other])
    assert min(float(a @ b), float(a @ c)) >= cache.matcher.recall_tau  # both offered
    cache.insert(swapped, "the swapped question's answer")
    cache.insert(other, "the other question's answer")
    miss = cache.lookup(asked)
    assert isinstance(miss, Miss)
    assert miss.reason.startswith("a cached question looked alike but differs in direction")


def test_two_stored_questions_that_each_pass_are_an_ambiguous_miss(
        make_cache: CacheFactory, encoder: Encoder) -> None:
    """Each stored question alone would be served for the asked one (the model passes
    both), but they need different answers: with both stored, which one is meant is a
    guess, and the decision is a miss rather than the more probable one."""
    asked, beginner, quickly = ("How do I learn Python?",
                                "How do I learn Python as a beginner?",
                                "How do I learn Python quickly?")
    shipped = LearnedVerifier.load()
    assert shipped.probabilities(asked, [beginner])[0] >= shipped.threshold  # alone
    assert min(shipped.probabilities(asked, [beginner, quickly])) >= shipped.threshold
    cache = make_cache(settings=RULED)
    a, b, c = embed_texts(encoder, [asked, beginner, quickly])
    assert min(float(a @ b), float(a @ c)) >= cache.matcher.recall_tau  # both offered
    cache.insert(beginner, "start with the tutorial")
    alone = cache.lookup(asked)
    assert isinstance(alone, Hit) and alone.answer == "start with the tutorial"
    cache.insert(quickly, "build a small project")
    miss = cache.lookup(asked)
    assert isinstance(miss, Miss)
    assert miss.reason.startswith("several cached questions were judged the same question")
