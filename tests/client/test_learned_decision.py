"""The learned decision (``decision = "learned"``, shared/verifier/decision.py): the shipped
card, fitted by benchmarks/decision_study.py, serves the verifier's pick where it clearly
dominates even when the ambiguity rule would have declined, declines a low-probability
pick, never weighs a closer pick against it (its coefficients keep their a priori signs),
leaves the decision to the rules with another verifier or encoder than it was fitted on,
and is refused when its content, hash or fields are wrong.

The cache is real (DiskCache, the packaged MiniLM); the verifier is the shipped one's card
with probabilities set per stored question, since the real model cannot be made to give
a chosen probability on demand. The shipped card was fitted on MPNet: where a test needs
the learned decision to apply, it uses the shipped card refitted to nothing but the
tests' encoder's version (``for_test_encoder``, tests/support/decision_card.py)."""

import copy
import json
import logging
import re
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.client.cache.summary import stored_stats
from meancache.client.learning.bound import (
    Label,
    Rows,
    choose_pooled,
    labels_needed,
    labels_to_pass,
)
from meancache.client.matching import matcher
from meancache.client.matching.matcher import ambiguous, learned_decision, shipped_verifier
from meancache.shared.encoder import Encoder
from meancache.shared.errors import VerifierError
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.verifier.decision import (
    CARD_PATH,
    FEATURES,
    KEEPS,
    SIGNS,
    LearnedDecision,
    card_digest,
    features,
    judge_for,
)
from pydantic import ValidationError

from tests.support.decision_card import use_card_for
from tests.support.fixed_verifier import (
    ASKED,
    CLOSE,
    OTHER,
    RIGHT,
    Fixed,
    cache_with,
    just_over_threshold,
)
from tests.support.fuzz import fuzzed

CacheFactory = Callable[..., SemanticCache]


@pytest.fixture
def for_test_encoder(encoder: Encoder, monkeypatch: pytest.MonkeyPatch) -> LearnedDecision:
    """The shipped card as if fitted on the tests' encoder (MiniLM)."""
    return use_card_for(encoder.model_version, monkeypatch)


@pytest.mark.usefixtures("for_test_encoder")
def test_a_dominant_pick_is_served_where_the_ambiguity_rule_declines(
        make_cache: CacheFactory) -> None:
    verifier = Fixed({RIGHT: 0.995, CLOSE: just_over_threshold(), OTHER: 0.02})
    assert ambiguous(np.array([0.995, verifier.by_text[CLOSE], 0.02]),
                     verifier.threshold)  # two pass
    assert isinstance(cache_with(make_cache, "rules", verifier).lookup(ASKED), Miss)
    hit = cache_with(make_cache, "learned", verifier).lookup(ASKED)
    assert isinstance(hit, Hit) and hit.answer == f"answer to {RIGHT}"


@pytest.mark.usefixtures("for_test_encoder")
def test_a_low_probability_pick_is_declined(make_cache: CacheFactory) -> None:
    # a near-miss alone, close by cosine, that the verifier finds a different question
    hit = cache_with(make_cache, "learned", Fixed({CLOSE: 0.15})).lookup(ASKED)
    assert isinstance(hit, Miss)  # the reason says how far under the line it fell
    assert re.search(r"\(p=0\.15; decision score 0\.\d\d, served from 0\.\d\d\)$",
                     hit.reason), hit.reason


@pytest.mark.usefixtures("for_test_encoder")
def test_two_equal_picks_are_declined(make_cache: CacheFactory) -> None:
    """Two candidates the verifier cannot tell apart: which answer is meant is a guess."""
    verifier = Fixed({RIGHT: 0.90, CLOSE: 0.90, OTHER: 0.02})
    assert isinstance(cache_with(make_cache, "learned", verifier).lookup(ASKED), Miss)


@pytest.mark.usefixtures("for_test_encoder")
def test_another_verifier_leaves_the_decision_to_the_rules(make_cache: CacheFactory) -> None:
    """The coefficients weigh the shipped verifier's probabilities: with another verifier
    (another card) the rules decide, and the ambiguity rule declines."""
    verifier = Fixed({RIGHT: 0.995, CLOSE: just_over_threshold(), OTHER: 0.02})
    verifier.card = type(verifier.card)("0" * 64, verifier.threshold)
    assert isinstance(cache_with(make_cache, "learned", verifier).lookup(ASKED), Miss)


@pytest.mark.parametrize("fine_tuned", [True, False])
def test_a_federated_fine_tune_of_the_cards_verifier_is_decided_by_the_card_as_another_judge(
        make_cache: CacheFactory, for_test_encoder: LearnedDecision, fine_tuned: bool,
        tmp_path: Path) -> None:
    """A global verifier made on the device from FL rounds over the card's verifier (its
    card names that one as ``base``) only moves its probabilities: the card still decides
    (the rules would decline this pick as ambiguous), but its score is another judge's,
    so the card's labels, scored by the base, back nothing: the threshold they back is
    that judge's prior. A fine-tune of another verifier leaves the decision to the rules."""
    verifier = Fixed({RIGHT: 0.995, CLOSE: just_over_threshold(), OTHER: 0.02})
    base = for_test_encoder.verifier_sha256 if fine_tuned else "0" * 64
    verifier.card = replace(verifier.card, sha256="1" * 64, global_model="2" * 64,
                            tuned_from=base)
    cache = cache_with(make_cache, "learned", verifier)
    looked = cache.lookup(ASKED)
    if not fine_tuned:
        assert isinstance(looked, Miss) and cache.matcher.judge.name == "2" * 64
        return
    assert isinstance(looked, Hit) and looked.answer == f"answer to {RIGHT}"
    assert cache.learned.judge == f"{for_test_encoder.judge} over {'2' * 64}"
    first = cache_with(make_cache, "learned", Fixed({RIGHT: 0.995}), tmp_path / "first")
    first.lookup(ASKED)
    bound = cache.learned.bound
    assert not bound.learned and bound.labels == 0
    assert bound.threshold == first.learned.bound.threshold < 1  # what the card's labels back


def test_cache_stats_judge_by_the_verifier_the_device_runs(
        make_cache: CacheFactory, for_test_encoder: LearnedDecision, tmp_path: Path) -> None:
    """`cache stats` (no model loaded) reads the bound of the judge the open cache runs:
    after a round, the decision over the device's global verifier (its labels), not the
    shipped card's (whose labels back the shipped verifier only)."""
    verifier = Fixed({RIGHT: 0.995})
    verifier.card = replace(verifier.card, sha256="1" * 64, global_model="2" * 64,
                            tuned_from=for_test_encoder.verifier_sha256)
    cache = cache_with(make_cache, "learned", verifier, tmp_path / "device")
    cache.lookup(ASKED)
    cache.learned.learn(Label(0.99, False, 1.0, "an entry", "miss"))
    assert cache.learned.bound.labels == 1
    stats = stored_stats(cache.store, 0.3, "onnx", 0.02, verifier.card, True)
    assert (stats.wrong_rate_labels, stats.wrong_rate_pooled) == (1, 0)
    shipped = stored_stats(cache.store, 0.3, "onnx", 0.02, shipped_verifier().card, True)
    assert shipped.wrong_rate_labels == shipped.wrong_rate_pooled >= labels_to_pass(0.01, 0.02)


def test_another_encoder_leaves_the_decision_to_the_rules(
        make_cache: CacheFactory, encoder: Encoder, caplog: pytest.LogCaptureFixture) -> None:
    """The coefficients weigh the cosines of the encoder the card names (MPNet): with the
    tests' MiniLM the rules decide, and the ambiguity rule declines what the card serves
    with a card for this encoder (test above); logged once, not per lookup."""
    assert learned_decision().encoder_version != encoder.model_version
    verifier = Fixed({RIGHT: 0.995, CLOSE: just_over_threshold(), OTHER: 0.02})
    cache = cache_with(make_cache, "learned", verifier)
    with caplog.at_level(logging.WARNING, "meancache.client.matching.matcher"):
        assert isinstance(cache.lookup(ASKED), Miss)
        assert isinstance(cache.lookup("How could I reverse a list in Python?"), Miss)
    warned = [r.getMessage() for r in caplog.records if "another encoder" in r.getMessage()]
    assert len(warned) == 1 and encoder.model_version in warned[0], warned


def test_the_shipped_card_keeps_the_a_priori_signs() -> None:
    """Each coefficient has the direction ``SIGNS`` gives it (benchmarks/decision_study.py
    fits within them): no feature that speaks for the pick weighs against it."""
    decision = learned_decision()
    for name, c in zip(FEATURES, decision.coefficients, strict=True):
        assert c * SIGNS[name] >= 0, (name, c)


@fuzzed(max_examples=60)
@given(cosines=st.lists(st.floats(0.78, 1.0), min_size=1, max_size=5),
       probabilities=st.lists(st.floats(0.0, 1.0), min_size=5, max_size=5),
       closer=st.floats(0.0, 0.2))
def test_a_closer_pick_never_scores_lower(cosines: list[float], probabilities: list[float],
                                          closer: float) -> None:
    """Every candidate moved closer by the same amount (the pick among them, the nearest
    still the nearest): the decision's score does not fall. The first card weighed the
    pick's cosine against it, so a near-identical paraphrase could be declined where a
    looser one was served."""
    decision, threshold = learned_decision(), shipped_verifier().threshold
    cosines = sorted(cosines, reverse=True)
    shift = min(closer, 1.0 - cosines[0])
    p = probabilities[:len(cosines)]
    before = decision.score(features(cosines, p, 0.776, threshold))
    after = decision.score(features([c + shift for c in cosines], p, 0.776, threshold))
    assert after >= before - 1e-12, (cosines, p, shift, before, after)


def test_the_score_grows_with_the_gap_over_the_runner_up() -> None:
    decision = learned_decision()
    threshold = shipped_verifier().threshold
    scores = [decision.score(features([0.9, 0.88], [0.95, p2], 0.776, threshold))
              for p2 in (0.9, 0.6, 0.3, 0.05)]
    assert scores == sorted(scores) and scores[-1] > scores[0]


def test_features_need_one_probability_per_cosine() -> None:
    with pytest.raises(ValueError, match="2 cosines for 1 probabilities"):
        features([0.9, 0.8], [0.5], 0.776, 0.5)
    assert len(features([0.9], [0.5], 0.776, 0.5)) == len(FEATURES)


# the card ----------------------------------------------------------------------------
def shipped_card() -> dict:
    return json.loads(CARD_PATH.read_text(encoding="utf-8"))


def test_the_shipped_card_loads_and_names_its_data() -> None:
    card = shipped_card()
    assert card["sha256"] == card_digest(card)
    assert len(card["data_sha256"]) == 64 and card["command"].startswith("python benchmarks/")
    assert card["verifier_sha256"] == shipped_verifier().card.sha256
    assert card["encoder"] == "all-mpnet-base-v2" and len(card["encoder_version"]) == 16
    assert set(LearnedDecision.load().keeps) <= set(KEEPS)


@fuzzed(max_examples=40)
@given(field=st.sampled_from(["coefficients", "intercept", "threshold", "keeps",
                              "verifier_sha256", "encoder", "encoder_version", "features",
                              "evidence"]),
       data=st.data())
def test_a_changed_card_is_refused_by_its_hash(field: str, data: st.DataObject) -> None:
    card = shipped_card()
    if field == "coefficients":
        i = data.draw(st.integers(0, len(FEATURES) - 1))
        card[field][i] += data.draw(st.floats(0.001, 10)) * data.draw(st.sampled_from([-1, 1]))
    elif field in ("intercept", "threshold"):
        card[field] = card[field] + data.draw(st.floats(0.0001, 0.1))
    elif field == "keeps":
        card[field] = [k for k in KEEPS if k not in card[field]][:1] or []
    elif field == "evidence":  # one more wrong label in a bin that holds labels
        i = data.draw(st.integers(0, len(card[field]["bins"]) - 1))
        for key in ("bound-labels", "bound-weight", "bound-weight-squared",
                    "bound-weight-wrong"):
            card[field][key][i] += 1
    else:
        card[field] = data.draw(st.text(min_size=1, max_size=8))
    with pytest.raises(VerifierError, match="does not match its sha256"):
        LearnedDecision.from_card(card)


@pytest.mark.parametrize(("change", "message"), [
    (lambda c: c.pop("threshold"), "must have exactly the fields"),
    (lambda c: c.update(extra=1), "must have exactly the fields"),
    (lambda c: c.update(features=list(reversed(FEATURES))), "names the features"),
    (lambda c: c.update(coefficients=c["coefficients"][:-1]), "finite coefficients"),
    (lambda c: c.update(coefficients=["x"] * len(FEATURES)), "not a number"),
    (lambda c: c.update(threshold=1.5), "threshold between 0 and 1"),
    (lambda c: c.update(keeps=["everything"]), "may keep only some of"),
    (lambda c: c["evidence"].update(bins=[-1] * len(c["evidence"]["bins"])),
     "evidence is not bound evidence"),
    (lambda c: c["evidence"]["bound-weight-wrong"].__setitem__(0, 1e9),
     "evidence is not bound evidence"),
], ids=["missing", "extra", "features", "short", "text", "threshold", "keeps", "bins",
        "more wrong than labelled"])
def test_a_card_with_wrong_fields_is_refused_even_if_rehashed(change, message: str) -> None:
    card = copy.deepcopy(shipped_card())
    change(card)
    card["sha256"] = card_digest(card)
    with pytest.raises(VerifierError, match=message):
        LearnedDecision.from_card(card)


def test_a_missing_card_is_refused(tmp_path) -> None:
    with pytest.raises(VerifierError, match="missing or unreadable"):
        LearnedDecision.load(tmp_path / "decision.json")


def test_an_unknown_decision_setting_is_refused() -> None:
    with pytest.raises(ValidationError, match="decision 'guess' is unknown"):
        CacheSettings(decision="guess")


def without_evidence(decision: LearnedDecision, monkeypatch: pytest.MonkeyPatch
                     ) -> LearnedDecision:
    """``decision``'s card with no evidence of its own: the bound starts at its threshold
    and only this device's labels move it."""
    bare = replace(decision, evidence=BoundEvidence.empty().judged_by(decision.judge))
    monkeypatch.setattr(matcher, "learned_decision", lambda: bare)
    return bare


def test_labels_that_lower_the_bound_serve_what_the_card_declines(
        make_cache: CacheFactory, for_test_encoder: LearnedDecision,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vCache's promise: where this device's labels show a region of the decision's score
    right within max_wrong_rate, the cache answers there, under the card's threshold."""
    without_evidence(for_test_encoder, monkeypatch)
    cache = cache_with(make_cache, "learned", Fixed({CLOSE: 0.15}))
    assert isinstance(cache.lookup(ASKED), Miss)  # the card declines it
    score = cache.matcher.judge_score(ASKED, CLOSE)  # the lone candidate's score
    assert score < for_test_encoder.threshold
    needed = labels_needed(cache.settings.max_wrong_rate)
    # right labels from just under the pick's score up, on another entry: one fewer than
    # the bound needs first
    scores = np.linspace(score - 0.01, 0.99, needed)
    for s in scores[1:]:
        cache.learned.learn(Label(float(s), False, 1.0, "another entry", "miss"))
    assert not cache.learned.bound.learned
    assert isinstance(cache.lookup(ASKED), Miss)
    cache.learned.learn(Label(float(scores[0]), False, 1.0, "another entry", "miss"))
    assert cache.learned.bound.learned and cache.learned.bound.threshold <= score
    hit = cache.lookup(ASKED)
    assert isinstance(hit, Hit) and hit.answer == f"answer to {CLOSE}"


def test_the_cards_evidence_backs_the_bound_from_the_first_lookup(
        make_cache: CacheFactory, for_test_encoder: LearnedDecision, tmp_path: Path) -> None:
    """A new cache's bound rests on the card's own labels (its choose splits' picks): it
    passes where their upper limit is within the rate, starting where half the rate is
    expected to pass, and says how many labels back it; at a rate they cannot support,
    the region they show too wrong is closed."""
    evidence = for_test_encoder.evidence
    assert evidence.labels > labels_to_pass(0.01, 0.02) and evidence.judge == \
        for_test_encoder.judge
    cache = cache_with(make_cache, "learned", Fixed({RIGHT: 0.99}))
    fresh = cache.stats()  # before any lookup, as a new user's stats screen reads it
    assert isinstance(cache.lookup(ASKED), Hit)
    bound = cache.learned.bound
    assert cache.learned.judge == for_test_encoder.judge
    assert bound.learned and bound.upper is not None and bound.upper <= 0.02
    assert bound.labels == bound.pooled >= labels_to_pass(0.01, 0.02)
    expected = choose_pooled([], [], Rows.pooled_bins(*evidence.rows()), 0.02,
                             for_test_encoder.threshold, start=labels_to_pass(0.01, 0.02))
    assert bound == expected
    assert fresh.serves_from == expected.threshold and fresh.wrong_rate_upper == bound.upper
    stats = cache.stats()
    assert stats.serves_from == bound.threshold and not stats.closed
    assert stats.serves_from_line == f"{bound.threshold:.3f}"
    strict = make_cache(tmp_path / "strict", verifier=Fixed({}),
                        settings=CacheSettings(max_wrong_rate=0.001))
    strict.learned.use(strict.matcher.judge)
    assert strict.learned.bound.threshold > 1  # the card's region is wrong above 0.1%


def test_the_devices_wrong_labels_refuse_the_cards_evidence(
        make_cache: CacheFactory, for_test_encoder: LearnedDecision) -> None:
    """Where this device's own labels show the region the card's evidence opened too
    wrong (the lower limit of their error above the rate), its traffic is not the card's:
    the bound on its labels alone stands, and the pick is declined."""
    cache = cache_with(make_cache, "learned", Fixed({RIGHT: 0.995}))
    assert isinstance(cache.lookup(ASKED), Hit)
    opened = cache.learned.bound.threshold
    scores = np.linspace(opened, 1.0, 60)  # half of them wrong, all over the opened region
    for i, score in enumerate(scores):
        cache.learned.learn(Label(float(score), i % 2 == 1, 1.0, "another entry", "miss"))
    assert cache.learned.bound.threshold > 1
    assert isinstance(cache.lookup("How could I reverse a list in Python?"), Miss)
    stats = cache.stats()  # says what closed it, and that only repeats are served
    assert stats.closed and stats.serves_from is None and stats.wrong_rate is not None
    assert stats.wrong_rate_upper > 0.02 and "nothing is served by similarity" in \
        stats.wrong_rate_line


def test_the_fl_server_names_the_judge_a_device_scores_with(
        make_cache: CacheFactory, for_test_encoder: LearnedDecision, tmp_path: Path) -> None:
    """A round pools the labels of the judge it names: for the shipped verifier and the
    encoder the card was fitted on, the card's (as the device names it); for another
    verifier, or another encoder, the verifier's own."""
    card = dict(shipped_card(), encoder_version=for_test_encoder.encoder_version)
    card["sha256"] = card_digest(card)
    path = tmp_path / "decision.json"
    path.write_text(json.dumps(card), encoding="utf-8")
    device = cache_with(make_cache, "learned", Fixed({RIGHT: 0.99})).matcher.judge.name
    verifier = for_test_encoder.verifier_sha256
    assert judge_for(verifier, for_test_encoder.encoder_version, card_path=path) == device
    assert judge_for("0" * 64, for_test_encoder.encoder_version, card_path=path) == "0" * 64
    assert judge_for(verifier, "another encoder", card_path=path) == verifier
    assert judge_for(verifier, for_test_encoder.encoder_version, card_path=tmp_path / "none"
                     ) == verifier
    # a federated fine-tune of the card's verifier, named by its global model's sha256
    tuned = Fixed({RIGHT: 0.99})
    tuned.card = replace(tuned.card, sha256="1" * 64, global_model="2" * 64, tuned_from=verifier)
    device = cache_with(make_cache, "learned", tuned, tmp_path / "tuned").matcher.judge.name
    assert judge_for("2" * 64, for_test_encoder.encoder_version, verifier, path) == device
    assert judge_for("2" * 64, for_test_encoder.encoder_version, "0" * 64, path) == "2" * 64
