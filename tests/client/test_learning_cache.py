"""The cache learns from its own traffic: a miss whose declined candidate turns out to
have the same answer (the upstream's answer agrees with the cached one) is a labelled
pair and makes the question an alias, answered at once next time, after a reopen too;
a different answer is a wrong label and no alias; resetting the learning forgets it and
keeps the entries; the federation's pool counts in an open cache as soon as it is
installed."""

import random
from collections.abc import Callable
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import stored_stats
from meancache.client.device_caches import set_device_pooled
from meancache.shared.fl.bound_evidence import BoundEvidence, cosine_judge
from meancache.shared.verifier.runtime import Card, LearnedVerifier, read_card

from tests.support.tiny_verifier import built_tiny_verifier

CacheFactory = Callable[..., SemanticCache]
FRANCE = "What is the capital of France?"
PARAPHRASE = "Which city is the capital of France?"
GERMANY = "What is the capital of Germany?"
EGG, EGG_AGAIN = "How long should I boil an egg?", "How long should I boil an egg for?"
ANSWER = "The capital of France is Paris, a city on the Seine in the north of the country."
# tau low enough that the questions reach the verifier, which declines everything
SETTINGS = CacheSettings(global_threshold=0.3, pca_dims=0)


@pytest.fixture(scope="module")
def declining(tmp_path_factory: pytest.TempPathFactory) -> LearnedVerifier:
    directory = built_tiny_verifier(tmp_path_factory)
    return LearnedVerifier(directory / "verifier.onnx",
                           Card(read_card(directory).sha256, 1.0 - 1e-9))


def test_an_agreeing_answer_makes_an_alias_that_survives_a_reopen(
        make_cache: CacheFactory, declining: LearnedVerifier, tmp_path: Path) -> None:
    cache = make_cache(settings=SETTINGS, verifier=declining)
    cache.insert(FRANCE, ANSWER)
    assert isinstance(cache.lookup(PARAPHRASE), Miss)
    cache.insert(PARAPHRASE, ANSWER)  # the upstream's answer: the same
    assert len(cache.learned.labels) == 1 and not cache.learned.labels[0].wrong
    cache.close()
    again = make_cache(settings=SETTINGS, verifier=declining)
    hit = again.lookup(PARAPHRASE.lower())
    assert isinstance(hit, Hit) and hit.answer == ANSWER and hit.matched_query == FRANCE
    assert again.reset_learning() > 0
    assert isinstance(again.lookup(PARAPHRASE.lower()), Hit)  # its own entry, by identity
    assert again.learned.labels == [] and again.learned.alias(PARAPHRASE) is None
    assert len(again) == 2


def test_an_open_cache_answers_from_a_pool_installed_while_it_is_open(
        make_cache: CacheFactory, declining: LearnedVerifier, tmp_path: Path) -> None:
    """`fl sync` and a round install the federation's pooled labels through a store of
    their own (client.device_caches), from this process or another: the cache already
    open follows them at its next lookup, not at its next open; a pool of another
    verifier's scores it ignores."""
    cache = make_cache(settings=SETTINGS, verifier=declining)
    cache.insert(FRANCE, ANSWER)
    assert isinstance(cache.lookup(PARAPHRASE), Miss)  # the card's threshold declines it
    right = BoundEvidence.of_labels(np.linspace(0.0, 0.05, 400), np.zeros(400), np.ones(400))
    set_device_pooled([tmp_path / "cache"], right.judged_by("another verifier"))
    assert isinstance(cache.lookup(PARAPHRASE), Miss)
    assert cache.learned.pooled.judge == "another verifier" and cache.learned.bound.pooled == 0
    set_device_pooled([tmp_path / "cache"], right.judged_by(declining.card.judge))
    hit = cache.lookup(PARAPHRASE)  # 400 right labels from score 0 up: the bound passes
    assert isinstance(hit, Hit) and hit.answer == ANSWER and hit.matched_query == FRANCE
    assert cache.learned.bound.pooled == 400


def test_a_global_models_two_pools_reach_each_cache_by_the_judge_it_runs(
        make_cache: CacheFactory, declining: LearnedVerifier, tmp_path: Path) -> None:
    """A global model carries the verifier's pool and the cosine's: installed in every
    cache, each applies the one naming its judge, the verifier-on cache the verifier's,
    the verifier-off cache (verify_hits false: the embedding's cosine judges) the one
    naming its own vector space, and neither the other's."""
    on = make_cache(tmp_path / "on", settings=SETTINGS, verifier=declining)
    off = make_cache(tmp_path / "off", settings=SETTINGS.model_copy(update={
        "verify_hits": False}))
    for cache in (on, off):
        cache.insert(FRANCE, ANSWER)
        cache.lookup(PARAPHRASE)  # its judge is named when it first weighs a candidate
    space = cosine_judge(off.encoder.version)
    assert (on.learned.judge, off.learned.judge) == (declining.card.judge, space)
    verifier = BoundEvidence.of_labels(np.linspace(0.0, 0.05, 300), np.zeros(300),
                                       np.ones(300))
    cosine = BoundEvidence.of_labels(np.linspace(0.0, 0.05, 400), np.zeros(400), np.ones(400))
    set_device_pooled([tmp_path / "on", tmp_path / "off"],
                      verifier.judged_by(declining.card.judge), cosine.judged_by(space))
    assert (on.learned.bound.pooled, off.learned.bound.pooled) == (300, 400)
    assert on.learned.pooled.judge == declining.card.judge and off.learned.pooled.judge == space
    set_device_pooled([tmp_path / "off"], cosine.judged_by(cosine_judge("another space")))
    assert off.learned.bound.pooled == 0  # a cosine measured elsewhere says nothing here


def test_a_different_answer_is_a_wrong_label_and_no_alias(
        make_cache: CacheFactory, declining: LearnedVerifier) -> None:
    cache = make_cache(settings=SETTINGS, verifier=declining)
    cache.insert(FRANCE, ANSWER)
    assert isinstance(cache.lookup(GERMANY), Miss)
    cache.insert(GERMANY, "Berlin is the capital of Germany, on the Spree in the north east.")
    assert [label.wrong for label in cache.learned.labels] == [True]
    assert cache.learned.alias(GERMANY) is None


def test_wrong_answer_is_the_strongest_label_and_ends_the_alias(
        make_cache: CacheFactory, declining: LearnedVerifier) -> None:
    cache = make_cache(settings=SETTINGS, verifier=declining)
    cache.insert(FRANCE, ANSWER)
    cache.lookup(PARAPHRASE)
    cache.insert(PARAPHRASE, ANSWER)
    hit = cache.lookup(PARAPHRASE.upper())
    assert isinstance(hit, Hit)  # by alias
    cache.reject(PARAPHRASE.upper(), hit.origin)
    assert cache.learned.labels[-1].wrong and cache.learned.labels[-1].source == "user"
    assert cache.learned.threshold(hit.entry_id) > cache.learned.labels[-1].score
    assert cache.learned.alias(PARAPHRASE) is None


PARAPHRASES = ["Which city is the capital of France?", "Tell me the capital of France.",
               "France's capital city is which one?", "Name the capital of France",
               "What city is France's capital?", "What's the capital city of France?",
               "In France, which city is the capital?", "Capital of France, please?",
               "Do you know the capital of France?", "Which is the French capital?"]


@pytest.fixture(scope="module")
def passing(tmp_path_factory: pytest.TempPathFactory) -> LearnedVerifier:
    """The tiny verifier with a threshold every pair reaches: each paraphrase is a would-be
    hit (one entry only, so the ambiguity rule never applies)."""
    directory = built_tiny_verifier(tmp_path_factory)
    return LearnedVerifier(directory / "verifier.onnx", Card(read_card(directory).sha256, 0.0))


def test_exploration_checks_the_would_be_hits_a_seeded_draw_picks_and_labels_them(
        make_cache: CacheFactory, passing: LearnedVerifier) -> None:
    seed, rate = 2026, 0.5  # the rate itself (not every near hit until the labels decide)
    settings = SETTINGS.model_copy(update=dict(explore_rate=rate, explore_width=1.0,
                                               explore_until_learned=False,
                                               explore_warmup=0))
    cache = make_cache(settings=settings, verifier=passing, rng=random.Random(seed))
    cache.insert(FRANCE, ANSWER)
    draws = random.Random(seed)  # every lookup is near (width 1), so one draw each
    expected = [draws.random() < rate for _ in PARAPHRASES]
    assert any(expected) and not all(expected)  # the seed shows both outcomes
    results = [cache.lookup(question) for question in PARAPHRASES]
    assert [isinstance(r, Miss) and r.explored for r in results] == expected
    assert all(isinstance(r, Hit) for r, explored in zip(results, expected, strict=True)
               if not explored)
    assert isinstance(cache.lookup(FRANCE), Hit)  # the very same question: never explored
    stats = cache.stats()
    assert stats.explored == sum(expected) and stats.misses == sum(expected)
    explored = PARAPHRASES[expected.index(True)]
    cache.insert(explored, ANSWER)  # the upstream's fresh answer agrees
    [label] = cache.learned.labels
    assert (label.source, label.labelled_with, label.wrong) == ("explore", rate, False)
    assert cache.learned.alias(explored) == label.entry


def test_a_new_cache_asks_upstream_for_its_first_would_be_hits_at_any_score(
        make_cache: CacheFactory, passing: LearnedVerifier) -> None:
    """The warm-up: until that many of the device's own labels score over the threshold,
    a would-be hit is explored whatever its score (a width of 0 leaves no band near the
    threshold, so only the warm-up explores here) and labelled as certain to be; after
    it, the same kind of question is no longer explored."""
    settings = SETTINGS.model_copy(update=dict(explore_width=0.0, explore_warmup=1))
    cache = make_cache(settings=settings, verifier=passing, rng=random.Random(0))
    cache.insert(FRANCE, ANSWER)
    first = cache.lookup(PARAPHRASES[0])
    assert isinstance(first, Miss) and first.explored
    assert "a new cache checks its first 1 matches; 0 checked so far" in first.reason
    assert cache.stats().warmup_line.startswith("on: every match is checked")
    cache.insert(PARAPHRASES[0], ANSWER)  # the upstream's fresh answer agrees
    [label] = cache.learned.labels
    assert (label.source, label.labelled_with, label.wrong) == ("explore", 1.0, False)
    assert cache.stats().warmup_line == "done (1 checked, 0 wrong)"
    stored = stored_stats(cache.store, 0.3, "onnx", 0.02, passing.card, explore_warmup=1)
    assert (stored.warmup, stored.checked, stored.warmup_line) == (
        1, 1, "done (1 checked, 0 wrong)")  # `cache stats`, from the store alone
    second = cache.lookup(PARAPHRASES[1])
    assert not (isinstance(second, Miss) and second.explored)
    assert cache.stats().explored == 1


def test_the_stats_say_whether_the_warmup_still_checks_every_match_and_why(
        make_cache: CacheFactory) -> None:
    stats = make_cache(settings=SETTINGS).stats()  # no draws given: nothing is explored
    assert stats.warmup == 0 and stats.warmup_line.startswith("off")
    assert ("matches checked first (warm-up)", stats.warmup_line) in stats.rows
    on = replace(stats, warmup=50, checked=12, checked_wrong=1, max_wrong_rate=0.02)
    assert on.warmup_line == ("on: every match is checked against a fresh answer until 50 "
                              "are (12 checked, 1 wrong)")
    over = replace(on, checked=61, checked_wrong=2, checked_within=False)
    assert over.warmup_line.startswith("on: 61 checked, 2 wrong, over 2.0%: every match is "
                                       "still checked")
    assert replace(over, checked_within=True).warmup_line == "done (61 checked, 2 wrong)"
    assert replace(over, closed=True).warmup_line.startswith("- (nothing is served")


def test_a_stored_rewording_with_the_same_answer_is_no_rival_to_its_entry(
        make_cache: CacheFactory, passing: LearnedVerifier) -> None:
    """An agreeing answer is stored under its own question too; the next rewording meets
    both stored questions, whose answer is one, and is served, not declined as
    ambiguous (every candidate passes this verifier, and two passing ones make a miss):
    a stored question with another answer still is a rival."""
    settings = SETTINGS.model_copy(update=dict(explore_width=0.0, explore_warmup=1))
    cache = make_cache(settings=settings, verifier=passing, rng=random.Random(0))
    cache.insert(FRANCE, ANSWER)
    assert isinstance(cache.lookup(PARAPHRASES[0]), Miss)  # the warm-up checks it
    cache.insert(PARAPHRASES[0], ANSWER)  # agrees: an alias, and an entry of its own
    assert len(cache) == 2 and cache.learned.alias(PARAPHRASES[0]) is not None
    hit = cache.lookup(PARAPHRASES[5])
    assert isinstance(hit, Hit) and hit.answer == ANSWER
    cache.insert(GERMANY, "Berlin.")
    cache.insert("Tell me the capital of Germany.", "Berlin is the capital.")  # its own
    assert isinstance(cache.lookup("Which city is the capital of Germany?"), Miss)


def test_exploration_off_serves_every_would_be_hit(make_cache: CacheFactory,
                                                   passing: LearnedVerifier,
                                                   tmp_path: Path) -> None:
    settings = SETTINGS.model_copy(update=dict(explore_rate=0.0, explore_width=1.0))
    cache = make_cache(settings=settings, verifier=passing, rng=random.Random(1))
    cache.insert(FRANCE, ANSWER)
    assert all(isinstance(cache.lookup(question), Hit) for question in PARAPHRASES)
    assert cache.stats().explored == 0
    exploring = settings.model_copy(update=dict(explore_rate=1.0))
    replaying = make_cache(tmp_path / "replay", settings=exploring, verifier=passing)
    replaying.insert(FRANCE, ANSWER)  # no draws given (a replay, a benchmark): no exploration
    assert all(isinstance(replaying.lookup(question), Hit) for question in PARAPHRASES)


def test_not_learning_from_answers_labels_only_wrong_answer(
        make_cache: CacheFactory, declining: LearnedVerifier, passing: LearnedVerifier,
        tmp_path: Path) -> None:
    """With ``learn_from_answers`` off (the embedded demo model's default): a declined
    candidate's answer, agreeing or not, makes no label and no alias; no would-be hit is
    explored, whatever the rate; a user's "wrong answer" still labels; stats say so."""
    off = SETTINGS.model_copy(update=dict(learn_from_answers=False, explore_rate=1.0,
                                          explore_width=1.0))
    cache = make_cache(tmp_path / "declining", settings=off, verifier=declining,
                       rng=random.Random(0))
    cache.insert(FRANCE, ANSWER)
    assert isinstance(cache.lookup(PARAPHRASE), Miss)
    cache.insert(PARAPHRASE, ANSWER)  # the same answer: with learning on, a label and alias
    assert isinstance(cache.lookup(GERMANY), Miss)
    cache.insert(GERMANY, "Berlin is the capital of Germany, on the Spree in the north east.")
    assert cache.learned.labels == [] and cache.learned.alias(PARAPHRASE) is None
    serving = make_cache(tmp_path / "passing", settings=off, verifier=passing,
                         rng=random.Random(0))
    serving.insert(FRANCE, ANSWER)
    hits = [serving.lookup(question) for question in PARAPHRASES]
    assert all(isinstance(hit, Hit) for hit in hits)  # rate 1, yet none explored
    stats = serving.stats()
    assert stats.explored == 0 and not stats.learns_from_answers
    assert "'wrong answer' only" in stats.labels_line
    serving.reject(PARAPHRASES[0], hits[0].origin)
    [label] = serving.learned.labels
    assert label.wrong and label.source == "user"
    # `cache stats` (no cache opened) reports what the cache facing traffic did, and
    # what the settings say where none has said
    assert not stored_stats(serving.store, 0.3, "onnx", 0.02, None,
                            learns_by_settings=True).learns_from_answers
    serving.close()
    make_cache(tmp_path / "passing", settings=SETTINGS, verifier=passing,
               rng=random.Random(0)).close()  # the chat started with an upstream named
    with closing(EntryStore(tmp_path / "passing")) as store:
        assert stored_stats(store, 0.3, "onnx", 0.02, None,
                            learns_by_settings=False).learns_from_answers
    make_cache(tmp_path / "unrecorded", settings=SETTINGS, verifier=passing).close()
    with closing(EntryStore(tmp_path / "unrecorded")) as store:  # no draws: faced no user
        assert stored_stats(store, 0.3, "onnx", 0.02, None,
                            learns_by_settings=False).learns_from_answers is False


def test_with_the_learned_verifier_off_the_bound_judges_by_the_cosine(
        make_cache: CacheFactory, declining: LearnedVerifier, tmp_path: Path) -> None:
    """With verification off the bound is held on the embedding's cosine, from tau: a
    candidate under tau (within the recall margin) is declined and labelled at its cosine
    by the upstream's answer, a "wrong answer" is a wrong label there, and the labels of
    the verifier (another judge, another scale) never count for it."""
    off = SETTINGS.model_copy(update={"verify_hits": False})
    # The stored vector is float16: each component within 2^-11 of its own size, so a
    # cosine of unit vectors read from the store moves by at most 2^-11 (Cauchy-Schwarz).
    stored = 2.0 ** -11
    cache = make_cache(tmp_path / "off", settings=off)
    cache.insert(FRANCE, ANSWER)
    near = cache.matcher.judge_score(GERMANY, FRANCE)
    cache.thresholds.set_global(near + off.recall_margin / 2)  # GERMANY: just under tau
    miss = cache.lookup(GERMANY)
    assert isinstance(miss, Miss) and "labels allow" in miss.reason
    cache.insert(GERMANY, "Berlin is the capital of Germany, on the Spree in the north east.")
    [label] = cache.learned.labels
    assert label.wrong and label.score == pytest.approx(near, abs=stored)
    assert label.judge == f"cosine {cache.encoder.version}"
    served = cache.lookup(PARAPHRASE)  # far over tau: its wrong label is under it
    assert isinstance(served, Hit) and served.matched_query == FRANCE
    cache.reject(PARAPHRASE, served.origin)
    assert cache.learned.labels[-1].wrong and cache.learned.labels[-1].source == "user"
    assert cache.learned.labels[-1].score == pytest.approx(served.similarity, abs=stored)
    refused = cache.lookup(PARAPHRASE.upper())  # its entry's threshold is over the press
    assert isinstance(refused, Miss) and "labels allow" in refused.reason
    stats = cache.stats()
    assert (stats.max_wrong_rate, stats.wrong_rate_labels, stats.wrong_rate) == (0.02, 1, 1.0)
    # a press is no sample of the served answers (no one presses on the right ones): it
    # closes its entry, not the cache, whose other entries are still served from tau
    assert not stats.closed and stats.serves_from == cache.thresholds.current
    cache.insert(EGG, "Seven minutes for a soft yolk, ten for a firm one.")
    assert isinstance(cache.lookup(EGG_AGAIN), Hit)
    # the learned verifier's judge reads none of the cosine's labels
    on = make_cache(tmp_path / "off", settings=SETTINGS, verifier=declining)
    assert on.stats().wrong_rate_labels == 0
