"""What the cache learns lives in its store: labels and aliases survive a reopen (and a
kill: each label is one transaction), the bound is derived from them, and resetting the
learning removes exactly them."""

import random
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from meancache.client.cache.store import EntryStore
from meancache.client.learning import state
from meancache.client.learning.agreement import agree
from meancache.client.learning.awaiting import Awaiting
from meancache.client.learning.bound import (
    USER,
    Bound,
    Judge,
    Label,
    OwnLabels,
    Rows,
    choose,
    choose_pooled,
    labels_needed,
)
from meancache.client.learning.explore import DECISION_EXPLORE_RATE, Exploration
from meancache.client.learning.state import (
    CHUNK,
    POOLED,
    Learned,
    labelled_questions,
    pooled,
    pools,
    send_evidence,
    set_pooled,
)
from meancache.shared.fl.bound_evidence import BoundEvidence, cosine_judge

PRIOR = 0.556
JUDGE = "verifier-a"  # the verifier scoring (its card.judge)


def test_naming_the_same_judge_again_keeps_the_bound(tmp_path: Path) -> None:
    """Every lookup names the judge (``Learned.use``): the bound, recomputed over up to
    20,000 labels, is kept until the judge, its prior or its evidence changes."""
    learned = Learned(EntryStore(tmp_path), 0.02)
    evidence = BoundEvidence.of_labels(np.linspace(0.9, 1.0, 800), np.zeros(800),
                                       np.ones(800)).judged_by("decision x")
    for judge in (Judge(JUDGE, PRIOR), Judge("decision x", 0.9, evidence)):
        learned.use(judge)
        bound = learned.bound
        learned.use(replace(judge))  # the same judge, named anew
        assert learned.bound is bound
    learned.use(Judge("decision x", 0.9, replace(evidence)))  # other evidence
    assert learned.bound is not bound and learned.bound.pooled == 800
    learned.use(Judge(JUDGE, PRIOR + 0.1))  # another prior
    assert learned.bound.threshold == PRIOR + 0.1 and not learned.bound.pooled


def test_a_device_sends_and_applies_only_the_pool_of_the_judge_it_runs(tmp_path: Path
                                                                       ) -> None:
    """Scores mean something only to the verifier that gave them: the labels a device
    sends for a round's pool are those its judge scored (not another verifier's, nor
    labels that name none), and a pool built on another judge's scores, or naming none
    (an older server's), is kept but never moves the bound."""
    store = EntryStore(tmp_path)
    mine = Learned(store, 0.02, PRIOR, judge=JUDGE)
    for i in range(30):
        mine.learn(Label(0.9, i % 10 == 0, entry=f"a{i}"))
    mine.judge = "verifier-b"  # a global verifier arrived: its labels are on its scale
    for i in range(20):
        mine.learn(Label(0.2, False, entry=f"b{i}"))
    store.set_states({"learning:labels:99": [{"score": 0.5, "wrong": False}]})  # no judge
    sent = send_evidence(store, JUDGE)
    assert sent.labels == 30 and float(sent.wrong.sum()) == 3 and sent.judge == ""
    assert send_evidence(store, "verifier-b").labels == 20
    assert send_evidence(store, "").labels == 0  # a round naming no judge gets none
    pool = BoundEvidence.of_labels(np.linspace(0.3, 0.5, 400), np.zeros(400), np.ones(400))
    for judge, applied in (("verifier-b", 400), (JUDGE, 0), ("", 0)):
        mine.install_pooled(pool.judged_by(judge))  # in an open cache
        assert mine.bound.pooled == applied, judge
        opened = Learned(store, 0.02, PRIOR, judge="verifier-b")  # and one opened after
        assert opened.pooled.labels == 400 and opened.bound.pooled == applied, judge
    store.close()


def test_the_cosine_judges_labels_are_sent_and_its_pool_applied_only_with_the_verifier_off(
        tmp_path: Path) -> None:
    """With the learned verifier off the embedding's cosine judges, named by its vector
    space: a device sends those labels for the round's cosine (not for its verifier, nor
    another space's), a global model's two pools are both installed, and each cache
    applies the one naming the judge it runs: the verifier's with the verifier on, the
    cosine's of its own space with it off, none for a space no pool names (a PCA layer
    of its own); an older install (one pool, not a list) still reads."""
    space, other_space = cosine_judge("full-space"), cosine_judge("own-pca")
    store = EntryStore(tmp_path)
    off = Learned(store, 0.02, 0.8, judge=space)  # tau is the cosine's prior
    for i in range(40):
        off.learn(Label(0.85 + i / 400, i % 20 == 0, entry=f"c{i}"))
    off.judge = JUDGE  # the same device's verifier-on cache
    for i in range(25):
        off.learn(Label(0.7, False, entry=f"v{i}"))
    cosine_sent, verifier_sent = send_evidence(store, space), send_evidence(store, JUDGE)
    assert (cosine_sent.labels, float(cosine_sent.wrong.sum())) == (40, 2)
    assert verifier_sent.labels == 25 and send_evidence(store, other_space).labels == 0
    right = BoundEvidence.of_labels(np.linspace(0.3, 0.5, 400), np.zeros(400), np.ones(400))
    verifier_pool = BoundEvidence.of_labels(np.full(300, 0.4), np.zeros(300), np.ones(300))
    set_pooled(store, verifier_pool.judged_by(JUDGE), right.judged_by(space))
    assert [pool.labels for pool in pools(store)] == [300, 400]
    assert pooled(store, space).labels == 400 and pooled(store).judge == JUDGE
    for judge, prior, applied in ((space, 0.8, 400), (JUDGE, PRIOR, 300),
                                  (other_space, 0.8, 0)):
        opened = Learned(store, 0.02, prior, judge=judge)
        assert opened.bound.pooled == applied, judge
        assert (opened.bound.threshold < prior) == bool(applied), judge  # the pool lowers it
    store.set_states({POOLED: right.judged_by(space).to_record()})  # installed by an old one
    assert Learned(store, 0.02, 0.8, judge=space).bound.pooled == 400
    assert Learned(store, 0.02, PRIOR, judge=JUDGE).bound.pooled == 0
    store.close()


def test_labels_sent_to_the_pool_count_once(tmp_path: Path) -> None:
    """A device's labels go out as evidence and come back inside the pool: the bound
    counts them once (the pool's copy), with the labels learned since; resetting the
    learning keeps the federation's pool, as it keeps the global threshold."""
    store = EntryStore(tmp_path)
    learning = Learned(store, 0.02, PRIOR, judge=JUDGE)
    for i in range(200):
        learning.learn(Label(0.4 + i / 1000, False, entry="e"))
    sent = send_evidence(store, JUDGE)
    assert sent.labels == 200
    others = BoundEvidence.of_labels(np.full(100, 0.5), np.zeros(100), np.ones(100))
    set_pooled(store, (sent + others).judged_by(JUDGE))
    learning = Learned(store, 0.02, PRIOR, judge=JUDGE)  # a cache opened after
    assert (learning.bound.labels, learning.bound.pooled) == (300, 300)
    for _ in range(7):
        learning.learn(Label(0.65, False, entry="e"))
    assert (learning.bound.labels, learning.bound.pooled) == (307, 300)
    learning.reset()
    assert learning.pooled.labels == 300 and learning.bound.pooled == 300
    store.close()


@pytest.mark.parametrize("installed_by", ["this cache", "another process"])
def test_an_open_cache_counts_the_labels_it_sent_once_the_pool_holding_them_arrives(
        tmp_path: Path, installed_by: str) -> None:
    """The chat stays open through a round: its labels are sent (through the device's
    own store) and come back inside the pool; from then on the open cache counts them
    there only, as one opened after would."""
    store = EntryStore(tmp_path)
    learning = Learned(store, 0.02, PRIOR, judge=JUDGE)
    for i in range(200):
        learning.learn(Label(0.4 + i / 1000, False, entry="e"))
    device = EntryStore(tmp_path)  # the device's round, beside the open cache
    sent = send_evidence(device, JUDGE)
    pool = (sent + BoundEvidence.of_labels(np.full(100, 0.5), np.zeros(100),
                                           np.ones(100))).judged_by(JUDGE)
    if installed_by == "this cache":
        learning.install_pooled(pool)
    else:
        set_pooled(device, pool)
    assert (learning.bound.labels, learning.bound.pooled) == (300, 300)
    learning.learn(Label(0.65, False, entry="e"))
    assert (learning.bound.labels, learning.bound.pooled) == (301, 300)
    assert learning.unsent == 1
    device.close()
    store.close()


def test_learning_persists(tmp_path: Path) -> None:
    store = EntryStore(tmp_path)
    store.set_meta("kept", 7)
    learning = Learned(store, 0.02, PRIOR)
    for i in range(CHUNK + 40):  # more than one chunk
        learning.learn(Label(0.3 + i / 2000, False, entry="e1"), f"question {i}")
    learning.learn(Label(0.9, True, entry="e2"), "a wrong one")
    before = learning.bound
    store.close()

    store = EntryStore(tmp_path)
    again = Learned(store, 0.02, PRIOR)
    assert len(again.labels) == CHUNK + 41
    assert again.bound == before
    assert again.alias("Question 5") == "e1"  # normalised lookup
    assert again.alias("a wrong one") is None  # a wrong answer makes no alias
    # each label keeps its question, normalised, for the verifier's federated training
    assert again.labels[-1].question == "a wrong one"
    assert [label.question for label in labelled_questions(store)][:2] == [
        "question 0", "question 1"]
    assert again.reset() > 0
    assert again.labels == [] and again.alias("question 5") is None
    assert again.bound.threshold == PRIOR
    assert store.get_meta("kept") == 7  # nothing else went
    store.close()


def test_a_forgotten_alias_stays_forgotten(tmp_path: Path) -> None:
    store = EntryStore(tmp_path)
    learning = Learned(store, 0.02, PRIOR)
    learning.learn(Label(0.7, False, entry="e1"), "What is it")
    learning.learn(Label(0.7, False, entry="e1"), "What is it not")
    learning.forget_alias("what is it")
    assert Learned(store, 0.02, PRIOR).alias("What is it") is None
    assert Learned(store, 0.02, PRIOR).alias("What is it not") == "e1"
    store.close()


def unit(texts: list[str]):
    import numpy as np
    rows = np.array([[len(t), t.count(" "), 1.0] for t in texts], dtype=float)
    return rows / np.linalg.norm(rows, axis=1, keepdims=True)


def test_short_answers_agree_only_when_equal() -> None:
    assert agree("100°C.", "100°c", unit)
    assert not agree("100°C", "212°F", unit)  # close vectors, other answers


def test_exploration_only_near_the_threshold() -> None:
    rng = random.Random(random.randrange(2**32))
    always = Exploration(rate=1.0, width=0.1)
    assert always.explores(0.55, 0.5, rng)
    assert not always.explores(0.65, 0.5, rng) and not always.explores(0.45, 0.5, rng)
    assert not Exploration(rate=0.0).explores(0.5, 0.5, rng)


def test_each_judge_explores_its_own_score_unless_the_settings_say() -> None:
    """A width is in the judge's score: the learned decision's explores within 0.05 of its
    threshold, 0.3 of the hits once the device's own labels settle it; the verifier's
    probability and the cosine 0.1 within 0.25; set values hold for every judge."""
    decision = Exploration.for_judge("decision " + "a" * 64)
    assert (decision.rate, decision.width, decision.until_learned) == (0.3, 0.05, True)
    for judge in ("b" * 64, "cosine 0123456789abcdef", ""):
        other = Exploration.for_judge(judge)
        assert (other.rate, other.width) == (0.1, 0.25)
    off = Exploration.for_judge("decision " + "a" * 64, rate=0.0, width=0.2,
                                until_learned=False)
    assert (off.rate, off.width, off.until_learned) == (0.0, 0.2, False)
    assert not off.explores(0.95, 0.9, random.Random(0), learned=False)


def test_exploring_until_learned_checks_every_near_hit_until_the_labels_decide() -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = random.Random(seed)
    warming = Exploration(rate=0.1, width=0.25, until_learned=True)
    assert warming.rate_now(learned=False) == 1.0 and warming.rate_now(learned=True) == 0.1
    assert Exploration(rate=0.0, until_learned=True).rate_now(learned=False) == 0.0  # off
    assert all(warming.explores(0.6, 0.5, rng, learned=False) for _ in range(50))
    assert not warming.explores(0.8, 0.5, rng, learned=False)  # not near: served
    draws = random.Random(seed)
    for _ in range(50):
        draws.random()
    expected = [draws.random() < 0.1 for _ in range(50)]
    assert [warming.explores(0.6, 0.5, rng, learned=True) for _ in range(50)] == expected


def test_hits_above_the_band_are_explored_at_their_own_rate_and_weighted_by_it(
        tmp_path: Path) -> None:
    """A judge may give wrong answers its highest scores: with ``beyond`` set, a would-be
    hit above the near band is explored at that chance (before and after the labels
    settle) and its label weighted by it; under the threshold nothing is, and exploration
    off turns it off too."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    exploration = Exploration(rate=0.3, width=0.05, until_learned=True, beyond=0.2)
    assert exploration.chance(0.99, 0.9, learned=False) == 0.2
    assert exploration.chance(0.99, 0.9, learned=True) == 0.2
    assert exploration.chance(0.92, 0.9, learned=False) == 1.0  # near: as before
    assert exploration.chance(0.89, 0.9, learned=False) == 0.0  # a miss is not explored
    assert Exploration(rate=0.0, beyond=0.2).chance(0.99, 0.9) == 0.0
    default = Exploration.for_judge("decision " + "a" * 64)
    assert (default.beyond, default.warmup) == (0.0, 50)  # the defaults
    rng, draws = random.Random(seed), random.Random(seed)
    expected = [draws.random() < 0.2 for _ in range(200)]
    assert [exploration.explores(0.99, 0.9, rng) for _ in range(200)] == expected
    with pytest.raises(ValueError, match="rate beyond the band"):
        Exploration(beyond=1.5)
    learned = Learned(EntryStore(tmp_path), 0.02)
    learned.use(Judge("cosine 0123456789abcdef", 0.5))  # width 0.25: near up to 0.75
    awaiting = Awaiting(learned, partial(Exploration.for_judge, beyond=0.5, warmup=0),
                        random.Random(seed))
    explored = [awaiting.explores(f"entry{i}", 0.9) for i in range(200)]
    draws = random.Random(seed)
    assert [p is not None for p in explored] == [draws.random() < 0.5 for _ in range(200)]
    assert all(p.labelled_with == 0.5 and p.source == "explore" for p in explored if p)


def test_every_would_be_hit_is_explored_until_the_warmup_has_labels_over_the_threshold(
        tmp_path: Path) -> None:
    """With ``warmup`` set, a would-be hit at any score is explored (labelled as certain
    to be) until that many of the device's own labels score over the threshold; labels
    under it do not count; after it the near band and ``beyond`` decide again."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    learned = Learned(EntryStore(tmp_path), 0.02)
    learned.use(Judge("cosine 0123456789abcdef", 0.5))  # width 0.25: near up to 0.75
    awaiting = Awaiting(learned, partial(Exploration.for_judge, warmup=5, rate=0.1),
                        random.Random(seed))
    for i in range(20):  # under the threshold: no warm-up label
        learned.learn(Label(0.4, False, entry=f"under{i}"))
    assert learned.own_over(0.5).labels == 0
    for i in range(5):
        pending = awaiting.explores(f"far{i}", 0.95)
        assert pending is not None and pending.labelled_with == 1.0
        learned.learn(Label(0.95, False, entry=f"far{i}"))
    assert learned.own_over(0.5) == OwnLabels(5, 0, True)
    assert all(awaiting.explores(f"served{i}", 0.95) is None for i in range(50))
    assert Exploration(rate=0.0, warmup=5).chance(0.95, 0.5, OwnLabels(0, 0, True)) == 0.0  # off
    with pytest.raises(ValueError, match="warm-up"):
        Exploration(warmup=-1)


def test_the_warmup_goes_on_while_its_labels_are_wrong_more_often_than_the_rate(
        tmp_path: Path) -> None:
    """At the count, a warm-up whose labels are wrong more often than the rate (but not
    enough to refuse the region) goes on, and says why; it ends once they are back within
    the rate. A user's "wrong answer" is not a sample: it neither counts nor is counted
    wrong."""
    learned = Learned(EntryStore(tmp_path), 0.02)
    learned.use(Judge("cosine 0123456789abcdef", 0.5))
    awaiting = Awaiting(learned, partial(Exploration.for_judge, warmup=50, rate=0.1),
                        random.Random(0))
    learned.learn(Label(0.9, True, entry="pressed", source=USER))
    for i in range(50):  # 2 wrong of 50: 4%, over the rate; lower limit 0.7%: not refused
        learned.learn(Label(0.9, i < 2, entry=f"e{i}"))
    assert learned.own_over(0.5) == OwnLabels(50, 2, False)
    assert not learned.bound.closed
    pending = awaiting.explores("next", 0.95)
    assert pending is not None and pending.labelled_with == 1.0
    assert "more while over 2.0% of them were wrong; 50 checked so far, 2 wrong" in pending.why
    for i in range(49):  # 2 of 99: still over the rate
        learned.learn(Label(0.9, False, entry=f"more{i}"))
        assert awaiting.explores(f"q{i}", 0.95) is not None
    learned.learn(Label(0.9, False, entry="last"))  # 2 of 100: within
    assert learned.own_over(0.5) == OwnLabels(100, 2, True)
    assert all(awaiting.explores(f"served{i}", 0.95) is None for i in range(50))


def test_evidence_from_elsewhere_is_explored_until_the_devices_own_labels_settle_it(
        tmp_path: Path) -> None:
    """The learned decision's card backs a threshold before the device has a label: every
    near would-be hit is explored (and labelled as certain to be) until 149 of the
    device's own labels score over the threshold, then the judge's rate of them, each
    label weighted by that rate, for as long as those labels are wrong no more often
    than the rate; labels under the threshold settle nothing."""
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    learned = Learned(EntryStore(tmp_path), 0.02)
    card = BoundEvidence.of_labels(np.linspace(0.9, 1.0, 2000), np.zeros(2000),
                                   np.ones(2000)).judged_by("decision x")
    learned.use(Judge("decision x", 0.95, card))
    awaiting = Awaiting(learned, Exploration.for_judge, random.Random(seed))
    threshold = learned.bound.threshold
    assert learned.bound.learned and not learned.settled(threshold)
    for i in range(200):  # wrong under the threshold: it stays, and nothing is settled
        learned.learn(Label(0.5, True, entry=f"under{i}"))
    assert learned.bound.threshold == threshold and not learned.settled(threshold)
    near = threshold + 0.01
    for i in range(labels_needed(0.02)):
        pending = awaiting.explores("e", near)
        assert pending is not None and pending.labelled_with == 1.0
        assert not learned.settled(threshold)
        learned.learn(Label(near, False, entry=f"over{i}"))
    assert learned.bound.threshold == threshold and learned.settled(threshold)
    draws = random.Random(seed)
    for _ in range(labels_needed(0.02)):  # a near hit draws even while every one is explored
        draws.random()
    expected = [draws.random() < DECISION_EXPLORE_RATE for _ in range(50)]
    explored = [awaiting.explores("e", near) for _ in range(50)]
    assert [pending is not None for pending in explored] == expected
    assert {pending.labelled_with for pending in explored if pending} == {DECISION_EXPLORE_RATE}
    assert awaiting.explores("e", threshold + 0.06) is None  # not near: served
    for i in range(4):  # the traffic now looks wrong more often than 2%: every one again
        learned.learn(Label(near, True, entry=f"wrong{i}"))
    assert learned.bound.threshold == threshold and not learned.settled(threshold)
    pending = awaiting.explores("e", near)
    assert pending is not None and pending.labelled_with == 1.0


def test_the_federations_pool_settles_a_threshold_as_the_devices_own_labels_do(
        tmp_path: Path) -> None:
    """The pool is labels of traffic (other devices'): with 149 of them over the
    threshold it settles as the device's own would; a device's labels already sent, and
    so inside the pool, count once."""
    store = EntryStore(tmp_path)
    learned = Learned(store, 0.02)
    card = BoundEvidence.of_labels(np.linspace(0.9, 1.0, 2000), np.zeros(2000),
                                   np.ones(2000)).judged_by("decision x")
    learned.use(Judge("decision x", 0.95, card))
    threshold = learned.bound.threshold
    needed = labels_needed(0.02)
    for i in range(needed - 1):
        learned.learn(Label(threshold + 0.01, False, entry=f"mine{i}"))
    sent = send_evidence(store, "decision x")  # these go into the pool, and count once
    assert learned.bound.threshold == threshold and not learned.settled(threshold)
    learned.install_pooled(sent.judged_by("decision x"))
    assert not learned.settled(threshold)
    other = BoundEvidence.of_labels(np.full(1, threshold + 0.02), np.zeros(1), np.ones(1))
    learned.install_pooled((sent + other).judged_by("decision x"))
    assert learned.bound.threshold == threshold and learned.settled(threshold)
    below = BoundEvidence.of_labels(np.full(500, threshold - 0.2), np.ones(500), np.ones(500))
    learned.install_pooled((sent + below).judged_by("decision x"))  # under it: not traffic's
    assert not learned.settled(threshold)
    store.close()


def test_only_the_labels_of_the_judge_now_scoring_count(tmp_path: Path) -> None:
    """A score means something only to the model that gave it: after a new verifier (a
    global one from federated learning, say) the old one's labels no longer move the
    bound, and they count again under the judge that scored them."""
    store = EntryStore(tmp_path)
    learning = Learned(store, 0.02, PRIOR, judge="verifier-a")
    for i in range(labels_needed(0.02) + 50):
        learning.learn(Label(0.3 + i / 10_000, False, entry=f"e{i}"), f"question {i}")
    assert learning.labels[0].judge == "verifier-a"
    assert learning.bound.learned and learning.bound.threshold < PRIOR
    learning.judge = "verifier-b"
    assert not learning.bound.learned and learning.bound.threshold == PRIOR
    store.close()
    store = EntryStore(tmp_path)
    assert Learned(store, 0.02, PRIOR, judge="verifier-a").bound.learned
    store.close()


def test_the_bound_kept_as_labels_come_is_the_bound_of_every_label_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The open cache keeps its counted labels' rows as labels come and the oldest go
    (past ``KEPT``, here made 60) and as the judge changes, with a pool from a round
    tested with the labels learned since; after every label its bound must be the bound
    of the kept labels themselves (those of the judge now scoring), and a cache opened on
    the same store must agree."""
    monkeypatch.setattr(state, "KEPT", 60)
    seed = random.randrange(2**32)
    print("seed", seed)
    rng = random.Random(seed)
    store = EntryStore(tmp_path)
    learning = Learned(store, 0.1, PRIOR, judge="verifier-a")
    pool = BoundEvidence.of_labels(np.linspace(0.5, 1.0, 300), np.zeros(300), np.ones(300))
    learned: list[Label] = []  # as stored: a label naming no judge gets the one scoring
    sent = 0
    for i in range(200):
        if i == 100:  # a round: the labels so far sent, the pool tested with those since
            send_evidence(store, "verifier-a")
            sent = len(learned)
            learning = Learned(store, 0.1, PRIOR, judge="verifier-a")
            learning.install_pooled(pool.judged_by("verifier-a"))
        if i in (70, 140):  # a global verifier, then the first again
            learning.judge = "verifier-b" if i == 70 else "verifier-a"
        edge = i in (99, 100)  # the last one sent and the first after: both count at once
        score = 0.99 if edge else rng.random()
        label = Label(score, rng.random() < 0.3 * (1 - score), entry=f"e{i % 7}",
                      judge="verifier-a" if edge else
                      rng.choice(["verifier-a", "verifier-b", ""]))
        learning.learn(label)
        learned.append(replace(label, judge=label.judge or learning.judge))
        own = [label for label in learned[-60:] if label.judge == learning.judge]
        if i < 100:
            expected = choose(own, 0.1, PRIOR)
        else:
            unsent = [label for label in learned[max(sent, len(learned) - 60):]
                      if label.judge == learning.judge]
            expected = choose_pooled(own, unsent, Rows.pooled_bins(*pool.rows()), 0.1, PRIOR)
        assert learning.bound == expected, i
        assert Learned(store, 0.1, PRIOR, judge=learning.judge).bound == expected, i
    assert len(learning.labels) == 60
    store.close()


def test_a_new_label_leaves_the_bound_ready_for_the_next_lookup(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound is recomputed where a label is learned (beside the upstream call that
    brought it), so the lookup after it reads the bound without testing the labels
    again; with no prior yet there is nothing to compute until the lookup sets it."""
    store = EntryStore(tmp_path)
    learning = Learned(store, 0.1, PRIOR, judge="verifier-a")
    tested: list[int] = []
    counting = state.choose

    def choose_counted(*args: object, **kwargs: object) -> Bound:
        tested.append(1)
        return counting(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(state, "choose", choose_counted)
    rng = random.Random(3)
    for i in range(40):
        learning.learn(Label(rng.random(), i % 9 == 0, entry=f"e{i % 5}"))
        assert len(tested) == i + 1
        ready = learning.bound
        assert len(tested) == i + 1  # the lookup tested nothing
        assert ready == choose(learning.labels, 0.1, PRIOR)
    learning.prior = None
    learning.learn(Label(0.9, False))
    assert len(tested) == 40
    learning.prior = PRIOR
    assert learning.bound == choose(learning.labels, 0.1, PRIOR) and len(tested) == 41
    store.close()
