"""Per-entry thresholds: a rejected entry becomes harder to hit, an often-accepted one
stays easy (never below the floor), other entries keep the global tau, and the evidence
survives a reopen and a change of vector space."""

from collections.abc import Callable

import numpy as np
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.client.config import load_settings
from meancache.client.matching.entry_threshold import MARGIN, RELAX, Evidence
from meancache.client.matching.question import embed_texts

CacheFactory = Callable[..., SemanticCache]

FRANCE = "What is the capital of France?"
PARAPHRASE = "Which city is the capital of France?"
LOOK_ALIKE = "What is the capital of Germany?"  # needs another answer: the user rejects it
EGGS = "How long should I boil an egg?"
EGGS_PARAPHRASE = "How many minutes do I boil eggs for?"
# Verification would veto the swapped country before the user sees it: these tests are
# about what feedback teaches, so they turn it off.
# With the learned verifier off the learned bound judges by the cosine, and one rejection
# shows its region too wrong at 2% (tests/client/test_learning_cache.py): these tests of
# tau and the entries' own thresholds keep the bound out of their way.
TAU_ALONE = {"verify_hits": False, "max_wrong_rate": 0.99}
SETTINGS = CacheSettings(global_threshold=0.3, **TAU_ALONE)


def hit(result: Hit | Miss) -> Hit:
    assert isinstance(result, Hit), f"expected a hit, got {result}"
    return result


def similarity(cache: SemanticCache, a: str, b: str) -> float:
    first, second = embed_texts(cache.encoder, [a, b])  # as the matcher embeds questions
    return float(np.dot(first, second))


def test_one_rejection_raises_only_that_entrys_threshold(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=SETTINGS)
    france = cache.insert(FRANCE, "Paris.")
    cache.insert(EGGS, "About seven minutes.")
    wrong = hit(cache.lookup(LOOK_ALIKE))
    assert wrong.entry_id == france.id
    cache.reject(wrong.query, wrong.origin)

    again = cache.lookup(LOOK_ALIKE)
    assert isinstance(again, Miss) and "rejected before" in again.reason
    assert again.best_similarity is not None and again.best_similarity >= cache.threshold
    assert cache.threshold == 0.3 and cache.stats().local_threshold is None
    # The rejected entry still answers its paraphrases, which sit well above the rejection.
    assert similarity(cache, FRANCE, PARAPHRASE) > wrong.similarity + MARGIN
    assert hit(cache.lookup(PARAPHRASE)).entry_id == france.id
    # The other entry keeps the global tau.
    eggs = hit(cache.lookup(EGGS_PARAPHRASE))
    assert eggs.matched_query == EGGS and eggs.similarity >= 0.3


def test_accepted_paraphrases_relax_the_entry_down_to_the_floor(
    make_cache: CacheFactory,
) -> None:
    probe = "what is france's capital city?"
    cache = make_cache(settings=CacheSettings(**TAU_ALONE))
    near = similarity(cache, FRANCE, probe)
    # The probe sits just under the global tau; a query under the floor must never be served.
    cache.thresholds.set_global(round(near + RELAX / 4, 4))
    cache.insert(FRANCE, "Paris.")
    assert isinstance(cache.lookup(probe), Miss)
    below_floor = "Is Paris a city in France?"
    assert similarity(cache, FRANCE, below_floor) < cache.threshold - RELAX

    cache.thresholds.set_global(0.3)  # served freely while users accept paraphrases
    for _ in range(20):
        hit(cache.lookup(PARAPHRASE))
    hit(cache.lookup(FRANCE))  # an exact repeat teaches nothing
    assert Evidence.of(cache.entries()[0]).accepted == 20
    cache.thresholds.set_global(round(near + RELAX / 4, 4))
    assert hit(cache.lookup(probe)).matched_query == FRANCE
    assert isinstance(cache.lookup(below_floor), Miss)


def test_the_raised_threshold_survives_a_reopen_and_the_setting_turns_it_off(
    make_cache: CacheFactory,
) -> None:
    cache = make_cache(settings=SETTINGS)
    cache.insert(FRANCE, "Paris.")
    wrong = hit(cache.lookup(LOOK_ALIKE))
    cache.reject(wrong.query, wrong.origin)
    cache.close()
    assert isinstance(make_cache(settings=SETTINGS).lookup(LOOK_ALIKE), Miss)
    off = CacheSettings(global_threshold=0.3, **TAU_ALONE, entry_thresholds=False)
    assert hit(make_cache(settings=off).lookup(LOOK_ALIKE)).matched_query == FRANCE


def test_the_setting_comes_from_the_environment_and_the_config_file(tmp_path) -> None:
    assert load_settings(tmp_path, tmp_path, environ={}).cache_settings().entry_thresholds
    env = {"MEANCACHE_ENTRY_THRESHOLDS": "off"}
    assert not load_settings(tmp_path, tmp_path, environ=env).cache_settings().entry_thresholds
    (tmp_path / "config.toml").write_text("entry_thresholds = false\n")
    assert not load_settings(tmp_path, tmp_path, environ={}).entry_thresholds


def test_a_pca_fit_rescores_the_rejection_in_the_new_space(
    make_cache: CacheFactory, distinct_questions: list[str],
) -> None:
    cache = make_cache(settings=CacheSettings(global_threshold=0.3, **TAU_ALONE,
                                              pca_dims=16, pca_min_entries=1000))
    france = cache.insert(FRANCE, "Paris.")
    for i, question in enumerate(distinct_questions[:30]):
        cache.insert(question, f"answer {i}")
    wrong = hit(cache.lookup(LOOK_ALIKE))
    cache.reject(wrong.query, wrong.origin)
    full_space = cache.encoder.version
    cache.fit_pca()
    assert cache.encoder.version != full_space

    result = cache.lookup(LOOK_ALIKE)
    evidence = Evidence.of(cache.store.get(france.id))
    assert evidence.space == cache.encoder.version
    new_similarity = similarity(cache, FRANCE, LOOK_ALIKE)
    assert evidence.rejected_similarity is not None
    assert abs(evidence.rejected_similarity - new_similarity) < 0.01
    assert not (isinstance(result, Hit) and result.entry_id == france.id)
