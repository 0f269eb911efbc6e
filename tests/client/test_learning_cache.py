"""The cache learns from its own traffic: a miss whose declined candidate turns out to
have the same answer (the upstream's answer agrees with the cached one) is a labelled
pair and makes the question an alias, answered at once next time, after a reopen too;
a different answer is a wrong label and no alias; resetting the learning forgets it and
keeps the entries."""

from collections.abc import Callable
from pathlib import Path

import pytest
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.shared.verifier.runtime import Card, LearnedVerifier, read_card

from tests.support.tiny_verifier import make_tiny_verifier

CacheFactory = Callable[..., SemanticCache]
FRANCE = "What is the capital of France?"
PARAPHRASE = "Which city is the capital of France?"
GERMANY = "What is the capital of Germany?"
ANSWER = "The capital of France is Paris, a city on the Seine in the north of the country."
# tau low enough that the questions reach the verifier, which declines everything
SETTINGS = CacheSettings(global_threshold=0.3, pca_dims=0)


@pytest.fixture(scope="module")
def declining(tmp_path_factory: pytest.TempPathFactory) -> LearnedVerifier:
    directory = make_tiny_verifier(tmp_path_factory.mktemp("tiny-verifier"))
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
