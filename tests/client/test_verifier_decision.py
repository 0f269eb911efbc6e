"""The decision with the learned verifier (``verifier = "learned"``, the default), on a tiny
random-init cross-encoder made the way the shipped one is (its probabilities mean
nothing; the mechanics are what is tested):
the counting candidates are scored in one batched call, the most probable one is served
only if it alone clears the verifier's threshold (two or more passing is an ambiguous
miss) and the rule checks kept beside it do not veto it, a veto is a miss (never a
fall-through), and feedback's per-entry thresholds keep working on top."""

from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.client.matching.matcher import VERIFIED_AT_MOST, ambiguous, shipped_verifier
from meancache.client.matching.settings import RECALL_MARGIN
from meancache.client.pack import PackHit
from meancache.shared.encoder import Encoder
from meancache.shared.verifier.runtime import Card, LearnedVerifier, read_card

from tests.client.test_matcher import pack_with
from tests.support.tiny_verifier import built_tiny_verifier

CacheFactory = Callable[..., SemanticCache]
ASKED = "What is the capital city of France?"
STORED = ["What is the capital of France?", "Which city is the capital of France?",
          "What is the capital of Spain?"]
LEARNED = "learned"
LOW_TAU = CacheSettings(global_threshold=0.3, recall_margin=0.0, verifier=LEARNED)  # all count


class Counting:
    """The real verifier, counting the calls made to it."""

    def __init__(self, verifier: LearnedVerifier) -> None:
        self.verifier, self.threshold, self.calls = verifier, verifier.threshold, []

    def probabilities(self, query: str, candidates: Sequence[str]) -> np.ndarray:
        self.calls.append(list(candidates))
        return self.verifier.probabilities(query, candidates)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return built_tiny_verifier(tmp_path_factory)


def tiny(directory: Path, threshold: float) -> Counting:
    card = read_card(directory)
    return Counting(LearnedVerifier(directory / "verifier.onnx",
                                    Card(card.sha256, threshold)))


def stored_by_similarity(cache: SemanticCache, encoder: Encoder) -> list[str]:
    vectors = encoder.encode(STORED + [ASKED])
    return [STORED[i] for i in np.argsort(-(vectors[:-1] @ vectors[-1]))]


def test_the_most_probable_candidate_is_served_after_one_batched_call(
        make_cache: CacheFactory, encoder: Encoder, tiny_dir: Path) -> None:
    probe = tiny(tiny_dir, 0.5)
    cache = make_cache(settings=LOW_TAU, verifier=probe)
    for question in STORED:
        cache.insert(question, f"answer to {question}")
    order = stored_by_similarity(cache, encoder)
    probabilities = probe.verifier.probabilities(ASKED, order)
    best = order[int(np.argmax(probabilities))]
    probe.threshold = float(probabilities.max()) - 1e-4
    probe.calls.clear()
    hit = cache.lookup(ASKED)
    assert isinstance(hit, Hit) and hit.answer == f"answer to {best}"
    assert probe.calls == [order]  # one call, every counting candidate, best first


def test_a_veto_is_a_miss_that_says_so_never_a_lower_candidate(
        make_cache: CacheFactory, tiny_dir: Path) -> None:
    probe = tiny(tiny_dir, 0.999)
    cache = make_cache(settings=LOW_TAU, verifier=probe)
    for question in STORED:
        cache.insert(question, f"answer to {question}")
    miss = cache.lookup(ASKED)
    assert isinstance(miss, Miss)
    assert miss.reason.startswith("the verifier judged it a different question (p=0.")
    assert len(probe.calls) == 1 and len(probe.calls[0]) == len(STORED)
    decision = cache.matcher.decide(cache.matcher.question(ASKED), [])
    assert not decision.vetoed  # nothing to verify is no veto


def test_the_verifier_sees_at_most_its_candidates_and_only_those_over_the_recall_tau(
        make_cache: CacheFactory, tiny_dir: Path) -> None:
    probe = tiny(tiny_dir, 0.999)
    cache = make_cache(settings=CacheSettings(global_threshold=0.2, recall_margin=0.0,
                                                verifier=LEARNED),
                       verifier=probe)
    for n in range(VERIFIED_AT_MOST + 3):
        cache.insert(f"What is the capital of country number {n}?", f"answer {n}")
    cache.lookup("What is the capital of country number 99?")
    assert [len(call) for call in probe.calls] == [VERIFIED_AT_MOST]
    probe.calls.clear()
    high = make_cache(directory=cache.store.directory.parent / "high",
                      settings=CacheSettings(global_threshold=0.999, recall_margin=0.0,
                                                verifier=LEARNED),
                      verifier=probe)
    high.insert("Tell me a joke", "a joke")
    assert isinstance(high.lookup("What is the capital of Peru?"), Miss)
    assert probe.calls == []  # nothing counting: the verifier is not run


def test_the_very_same_question_passes_by_identity(make_cache: CacheFactory,
                                                   tiny_dir: Path) -> None:
    probe = tiny(tiny_dir, 0.999)
    cache = make_cache(settings=LOW_TAU, verifier=probe)
    cache.insert(STORED[0], "Paris")
    hit = cache.lookup("  what is the capital of france ")
    assert isinstance(hit, Hit) and hit.answer == "Paris" and probe.calls == []


@pytest.mark.parametrize(("asked", "stored", "vetoed_as"), [
    ("Is Python faster than Java?", "Is Java faster than Python?", "direction"),
    ("What is the smallest ocean on Earth?", "What is the largest ocean on Earth?",
     "antonym"),
    ("What isn't the capital of France?", STORED[0], None),  # negation: the model's call
    ("What is the capital of Germany?", STORED[0], None),  # entity: the model's call
])
def test_only_the_kept_rule_checks_veto_what_the_verifier_accepts(
        make_cache: CacheFactory, tiny_dir: Path, asked: str, stored: str,
        vetoed_as: str | None) -> None:
    cache = make_cache(settings=LOW_TAU, verifier=tiny(tiny_dir, 0.0))  # passes all
    cache.insert(stored, "the stored answer")
    result = cache.lookup(asked)
    if vetoed_as is None:
        assert isinstance(result, Hit) and result.answer == "the stored answer"
    else:
        assert isinstance(result, Miss) and result.reason.startswith(
            f"a cached question looked alike but differs in {vetoed_as}")


def test_a_rejected_entry_stays_tightened_on_top_of_the_verifier(
        make_cache: CacheFactory, tiny_dir: Path) -> None:
    probe = tiny(tiny_dir, 0.0)  # the verifier passes everything: only feedback decides
    cache = make_cache(settings=LOW_TAU, verifier=probe)
    cache.insert(STORED[0], "Paris")
    hit = cache.lookup(ASKED)
    assert isinstance(hit, Hit)
    cache.reject(ASKED, hit.origin)
    again = cache.lookup(ASKED)
    assert isinstance(again, Miss) and "rejected before" in again.reason


def test_the_pack_decides_with_the_same_verifier(make_cache: CacheFactory, encoder: Encoder,
                                                 tmp_path: Path, tiny_dir: Path) -> None:
    packs = pack_with(tmp_path / "packs", STORED, encoder)
    vetoing = make_cache(settings=LOW_TAU, verifier=tiny(tiny_dir, 0.999))
    assert not isinstance(packs.lookup_similar(ASKED, vetoing.matcher), PackHit)
    probe = tiny(tiny_dir, 0.0)  # every instruction passes: ambiguous, a miss
    passing = make_cache(directory=tmp_path / "other", settings=LOW_TAU, verifier=probe)
    ambiguous_match = packs.lookup_similar(ASKED, passing.matcher)
    assert not isinstance(ambiguous_match, PackHit) and ambiguous_match.vetoed
    probe.threshold = float(probe.verifier.probabilities(ASKED, STORED).max()) - 1e-4
    assert isinstance(packs.lookup_similar(ASKED, passing.matcher), PackHit)  # one passes


@pytest.mark.parametrize("passing", [1, 2, len(STORED)])
def test_a_pick_is_served_only_when_it_alone_clears_the_threshold(
        make_cache: CacheFactory, encoder: Encoder, tiny_dir: Path, passing: int) -> None:
    """With the threshold between the ``passing``-th and the next probability: one
    passing candidate is served; two or more are an ambiguous miss that says so, counted
    as a decline, and no candidate is served instead."""
    probe = tiny(tiny_dir, 0.5)
    cache = make_cache(settings=LOW_TAU, verifier=probe)
    for question in STORED:
        cache.insert(question, f"answer to {question}")
    order = stored_by_similarity(cache, encoder)
    probabilities = np.sort(probe.verifier.probabilities(ASKED, order))[::-1]
    assert len(set(probabilities.tolist())) == len(STORED)  # distinct: a cut between each
    probe.threshold = float(probabilities[passing - 1]) - 1e-6
    result = cache.lookup(ASKED)
    if passing == 1:
        assert isinstance(result, Hit)
    else:
        assert isinstance(result, Miss)
        assert result.reason.startswith(
            "several cached questions were judged the same question (p=")
        kind = "declined:several cached questions were judged the same question"
        assert cache.store.counter(kind) == 1


def test_the_very_same_question_is_served_even_when_others_pass_too(
        make_cache: CacheFactory, tiny_dir: Path) -> None:
    cache = make_cache(settings=LOW_TAU, verifier=tiny(tiny_dir, 0.0))  # all pass
    for question in STORED:
        cache.insert(question, f"answer to {question}")
    hit = cache.lookup(STORED[1])
    assert isinstance(hit, Hit) and hit.answer == f"answer to {STORED[1]}"


@given(st.lists(st.floats(0.0, 1.0), max_size=VERIFIED_AT_MOST), st.floats(0.0, 1.0))
def test_ambiguous_means_a_second_candidate_reaches_the_threshold(
        probabilities: list[float], threshold: float) -> None:
    second = sorted(probabilities, reverse=True)[1] if len(probabilities) > 1 else -1.0
    assert ambiguous(np.array(probabilities), threshold) == (second >= threshold)


def test_the_learned_verifier_is_the_default(make_cache: CacheFactory) -> None:
    cache = make_cache()
    assert cache.settings.verifier == LEARNED and cache.settings.verify_hits
    assert cache.matcher.recall_tau == pytest.approx(cache.matcher.tau - RECALL_MARGIN)


def test_the_rules_never_load_the_learned_verifier(make_cache: CacheFactory) -> None:
    """With ``verifier = "rules"`` the word rules decide, on the cosine the learned bound
    judges by (its candidates start under tau, where its labels may lower it); the model is
    neither read nor run."""
    shipped_verifier.cache_clear()
    cache = make_cache(settings=CacheSettings(verifier="rules"))
    assert cache.matcher.recall_tau == cache.matcher.tau - cache.settings.recall_margin
    judge = cache.matcher.judge
    assert (judge.name, judge.prior) == (f"cosine {cache.encoder.version}", cache.matcher.tau)
    assert not judge.evidence.labels
    cache.insert(STORED[0], "Paris")
    assert isinstance(cache.lookup(ASKED), Hit)
    vetoed = cache.lookup("What isn't the capital of France?")
    assert isinstance(vetoed, Miss) and "negation" in vetoed.reason
    assert shipped_verifier.cache_info().currsize == 0 and cache.matcher._verifier is None


def test_an_unknown_verifier_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="verifier 'bert' is unknown; valid: rules, learned"):
        CacheSettings(verifier="bert")
