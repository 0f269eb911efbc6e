"""Labels scored anew by a global model's judge (client/fl/rescore.py): a label keeps the
candidates its judge weighed, so that the evidence round scores its pick as a lookup
would with the global verifier, in the same company; a label whose pick the new
verifier would not make is left out, and the learned decision's score weighs the rivals.

The cache is real (DiskCache, the packaged MiniLM); the verifiers give chosen
probabilities (the real model cannot be made to give a chosen one on demand)."""

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest
from meancache.client.cache import Miss, SemanticCache
from meancache.client.device_caches import Asked, device_rescored_evidence
from meancache.client.fl.rescore import rescorer
from meancache.client.learning.bound import Label
from meancache.shared.encoder import Encoder
from meancache.shared.pairs import Pair
from meancache.shared.verifier.decision import LearnedDecision, features

from tests.support.decision_card import use_card_for
from tests.support.fixed_verifier import ASKED, CLOSE, OTHER, RIGHT, Fixed, cache_with

CacheFactory = Callable[..., SemanticCache]
RECALL_TAU = 0.3


@pytest.fixture
def decision(encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> LearnedDecision:
    """The shipped card as if fitted on the tests' encoder."""
    return use_card_for(encoder.model_version, monkeypatch)


def probabilities_of(by_text: Mapping[str, float]) -> Callable[[list[Pair]], np.ndarray]:
    return lambda pairs: np.array([by_text[p.q2] for p in pairs], dtype=float)


def no_cosines(pairs: list[Pair]) -> np.ndarray:
    raise AssertionError(f"no cosine should be needed here, asked for {pairs}")


def test_a_declined_picks_label_keeps_the_candidates_weighed_with_it(
        make_cache: CacheFactory, decision: LearnedDecision) -> None:
    cache = cache_with(make_cache, "learned", Fixed({CLOSE: 0.15, OTHER: 0.02}))
    assert isinstance(cache.lookup(ASKED), Miss)
    cache.insert(ASKED, "answer to the question asked")  # the upstream's: they differ
    label = cache.learned.labels[-1]
    ids = {entry.query: entry.id for entry in cache.store.entries()}
    assert label.entry == ids[CLOSE] and label.wrong
    assert {key for key, _ in label.weighed} == {ids[CLOSE], ids[OTHER]}
    cosines = [cosine for _, cosine in label.weighed]
    assert cosines == sorted(cosines, reverse=True) and all(c >= RECALL_TAU for c in cosines)


def test_the_decision_scores_a_pick_anew_against_its_rivals(decision: LearnedDecision) -> None:
    """The score of the decision over the new verifier, as a lookup computes it; a rival
    the new verifier finds nearly as likely lowers it (the card weighs the runner-up)."""
    judge = decision.judge_of("2" * 64, decision.verifier_sha256)
    new = {RIGHT: 0.97, CLOSE: 0.90, OTHER: 0.01}
    score = rescorer(judge, probabilities_of(new), no_cosines, RECALL_TAU, 0.6)
    assert score is not None
    asked = [Asked(ASKED, [RIGHT, CLOSE, OTHER], [0.95, 0.9, 0.5], 0),
             Asked(ASKED, [RIGHT, OTHER], [0.95, 0.5], 0)]
    with_rival, without = score(asked)
    assert with_rival == decision.score(features([0.95, 0.9, 0.5], [0.97, 0.90, 0.01],
                                                 RECALL_TAU, 0.6))
    assert with_rival < without


def test_a_label_whose_pick_the_new_verifier_would_not_make_is_left_out(
        decision: LearnedDecision) -> None:
    new = {RIGHT: 0.40, CLOSE: 0.90}
    for judge in (decision.judge_of("2" * 64, decision.verifier_sha256), "2" * 64):
        score = rescorer(judge, probabilities_of(new), no_cosines, RECALL_TAU, 0.6)
        assert score is not None
        left_out, kept = score([Asked(ASKED, [RIGHT, CLOSE], [0.95, 0.9], 0),
                                Asked(ASKED, [RIGHT, CLOSE], [0.95, 0.9], 1)])
        assert np.isnan(left_out) and not np.isnan(kept)
    # the verifier's probability as the judge: the pick's probability itself
    assert rescorer("2" * 64, probabilities_of(new), no_cosines, RECALL_TAU, 0.6)(
        [Asked(ASKED, [CLOSE], [])])[0] == pytest.approx(0.90)


def test_a_pair_kept_alone_is_scored_with_the_encoders_cosine(
        decision: LearnedDecision) -> None:
    judge = decision.judge_of("2" * 64, decision.verifier_sha256)
    asked_for: list[Pair] = []

    def cosines(pairs: list[Pair]) -> np.ndarray:
        asked_for.extend(pairs)
        return np.full(len(pairs), 0.8)

    score = rescorer(judge, probabilities_of({RIGHT: 0.9}), cosines, RECALL_TAU, 0.6)
    assert score is not None
    assert score([Asked(ASKED, [RIGHT], [])])[0] == decision.score(
        features([0.8], [0.9], RECALL_TAU, 0.6))
    assert [(p.q1, p.q2) for p in asked_for] == [(ASKED, RIGHT)]


def test_a_judge_naming_another_card_is_not_scored(decision: LearnedDecision) -> None:
    assert rescorer("decision " + "0" * 64 + " over " + "2" * 64,
                    probabilities_of({}), no_cosines, RECALL_TAU, 0.6) is None


def test_the_evidence_round_leaves_out_labels_of_another_pick_and_entries_gone(
        make_cache: CacheFactory, decision: LearnedDecision, tmp_path: Path) -> None:
    """Over a real cache: three labels on RIGHT, one weighed against CLOSE, which the new
    verifier prefers (left out), one against OTHER, whose entry is then deleted (scored
    without it), one alone; the evidence holds the two kept, at their new scores."""
    directory = tmp_path / "device"
    cache = cache_with(make_cache, "learned", Fixed({RIGHT: 0.9, CLOSE: 0.5, OTHER: 0.1}),
                       directory)
    ids = {entry.query: entry.id for entry in cache.store.entries()}
    for rival in (CLOSE, OTHER):
        cache.learned.learn(Label(0.5, False, 1.0, ids[RIGHT], "miss", weighed=(
            (ids[RIGHT], 0.95), (ids[rival], 0.9))), ASKED)
    cache.learned.learn(Label(0.5, True, 1.0, ids[RIGHT], "user"), ASKED)
    cache.delete(ids[OTHER])
    judge = decision.judge_of("2" * 64, decision.verifier_sha256)
    new = {RIGHT.lower(): 0.9, CLOSE.lower(): 0.95}
    score = rescorer(judge, lambda pairs: np.array([new[p.q2.lower()] for p in pairs]),
                     lambda pairs: np.full(len(pairs), 0.8), RECALL_TAU, 0.6)
    (evidence,) = device_rescored_evidence([directory], [(judge, score)])
    assert evidence.labels == 2
    alone = decision.score(features([0.8], [0.9], RECALL_TAU, 0.6))
    kept = decision.score(features([0.95], [0.9], RECALL_TAU, 0.6))
    assert float(evidence.wrong.sum()) == 1.0  # the user's, scored alone
    assert evidence.count[int(alone * 256)] >= 1 and evidence.count[int(kept * 256)] >= 1


def test_the_evidence_round_scores_the_newest_labels_up_to_its_budget(
        make_cache: CacheFactory, tmp_path: Path) -> None:
    """The round's reply is awaited a bounded time and each label costs model calls, so a
    device scores its newest labels only, up to the budget, over all its caches; all are
    marked sent (their scores were by a judge the new pool replaces)."""
    first, second = tmp_path / "first", tmp_path / "second"
    scores = {RIGHT: 0.9, CLOSE: 0.5, OTHER: 0.1}
    for directory in (first, second):
        cache = cache_with(make_cache, "learned", Fixed(scores), directory)
        ids = {entry.query: entry.id for entry in cache.store.entries()}
        for question in ("oldest", "older", "newest"):
            cache.learned.learn(Label(0.5, False, 1.0, ids[RIGHT], "miss"),
                                f"{question} {ASKED}")
        cache.close()
    seen: list[list[str]] = []

    def rescore(asked: list[Asked]) -> np.ndarray:
        seen.append([a.question.split()[0] for a in asked])
        return np.full(len(asked), 0.9)

    (evidence,) = device_rescored_evidence([first, second], [("judge", rescore)], most=4)
    assert seen == [["oldest", "older", "newest"], ["newest"]]
    assert evidence.labels == 4
    (again,) = device_rescored_evidence([first, second], [("judge", rescore)], most=0)
    assert again.labels == 0 and seen[-2:] == [[], []]
