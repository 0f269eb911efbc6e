"""What the cache keeps and evicts (client/cache/policy/): eviction and admission order on
constructed streams whose right answer is known, SCALM's patterns and ranks, switching the
policy of an existing cache, refusing an unknown one, and the ratios the stats report."""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
from meancache.client.cache import CacheSettings, CacheStats, Hit, Miss, SemanticCache
from meancache.client.cache.entry import Entry
from meancache.client.cache.policy.admission import admits
from meancache.client.cache.policy.cache_policy import CachePolicy, PolicySettings
from meancache.client.cache.policy.eviction import Usage, eviction_order, victims
from meancache.client.cache.policy.patterns import (
    PatternInput,
    fit_co_hsc,
    fit_se_hsc,
    rank_patterns,
    token_saving_ratios,
)
from meancache.client.cache.policy.state import load_log, load_patterns
from meancache.client.cache.store import EntryStore
from meancache.client.config import load_settings
from meancache.client.errors import ConfigError
from meancache.client.tui.screens.stats import stats_rows
from meancache.shared.encoder import Encoder

from meancache.cli import main
from tests.conftest import CacheFactory

POPULAR = "What is the capital of France?"
ONE_OFFS = [
    "How do I bake sourdough bread at home?",
    "Which programming language should a beginner learn first?",
    "How many legs does a spider have?",
]


def scalm(policy: str = "scalm-co", **kwargs: object) -> CacheSettings:
    return CacheSettings(eviction_policy=policy, **kwargs)  # type: ignore[arg-type]


# eviction order ------------------------------------------------------------------------
USAGE = {  # id: last used, created, hits, bytes, SCALM priority
    "old-busy": Usage(last_used=50, created=1, hits=4, nbytes=10, priority=1),
    "old-idle": Usage(last_used=2, created=2, hits=0, nbytes=10, priority=3),
    "new-idle": Usage(last_used=30, created=3, hits=0, nbytes=10, priority=0),
    "new-hit": Usage(last_used=40, created=4, hits=1, nbytes=10, priority=2),
}


@pytest.mark.parametrize(("policy", "order"), [
    ("lru", ["old-idle", "new-idle", "new-hit", "old-busy"]),
    # hits, then the older of a tie: old-idle and new-idle both have 0 hits
    ("lfu", ["old-idle", "new-idle", "new-hit", "old-busy"]),
    # priority + hits: new-idle 0, new-hit 3, old-idle 3 (older than new-hit), old-busy 5
    ("scalm-co", ["new-idle", "old-idle", "new-hit", "old-busy"]),
    ("scalm-se", ["new-idle", "old-idle", "new-hit", "old-busy"]),
])
def test_eviction_order_of_each_policy(policy: str, order: list[str]) -> None:
    assert eviction_order(policy, USAGE) == order
    assert victims(policy, USAGE, over_count=2, over_bytes=0) == order[:2]
    assert victims(policy, USAGE, over_count=0, over_bytes=25) == order[:3]  # 10 bytes each
    assert victims(policy, USAGE, over_count=0, over_bytes=0) == []


def test_lfu_through_the_cache_evicts_the_least_hit_and_the_older_of_a_tie(
        make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(max_entries=3, eviction_policy="lfu"))
    a, b, c = (cache.insert(q, f"answer {i}") for i, q in enumerate([POPULAR, *ONE_OFFS[:2]]))
    for _ in range(2):
        assert isinstance(cache.lookup(a.query), Hit)
    assert isinstance(cache.lookup(b.query), Hit)
    d = cache.insert(ONE_OFFS[2], "answer 3")  # c has no hits: it goes, not the newer d
    assert {x.id for x in cache.entries()} == {a.id, b.id, d.id}
    e = cache.insert("Why is the sky blue during the day?", "answer 4")  # d ties e, d is older
    assert {x.id for x in cache.entries()} == {a.id, b.id, e.id}
    assert isinstance(cache.lookup(c.query), Miss)
    assert cache.stats().evictions == 2


# patterns and ranks ------------------------------------------------------------------------
def test_ranks_are_the_top_quarter_half_and_three_quarters_and_ties_rank_low() -> None:
    ratios = np.array([0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2])
    assert rank_patterns(ratios) == ("high", "high", "mid", "mid", "low", "low", None, None)
    # six patterns that saved nothing are not "top 25%" just because they tie
    assert rank_patterns(np.array([0.5, 0.4, 0, 0, 0, 0, 0, 0])) == (
        "high", "high", None, None, None, None, None, None)


def test_token_saving_ratio_is_tokens_of_hits_over_tokens_asked() -> None:
    labels = np.array([0, 0, 1])
    hits = np.array([3.0, 0.0, 0.0])
    asked = np.array([4.0, 1.0, 2.0])
    tokens = np.array([10.0, 30.0, 50.0])
    # pattern 0: 3 hits x 10 tokens saved of (4 x 10 + 1 x 30) asked; pattern 1 saved nothing
    assert token_saving_ratios(labels, hits, asked, tokens, 2) == pytest.approx([30 / 70, 0.0])


def blob(center: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    points = center + 0.01 * rng.normal(size=(count, len(center)))
    return points / np.linalg.norm(points, axis=1, keepdims=True)


AXES = np.eye(8)


def test_co_hsc_finds_each_rounds_topics_and_ranks_the_one_that_saves() -> None:
    rng = np.random.default_rng(0)
    vectors = np.vstack([blob(AXES[0], 5, rng), blob(AXES[1], 5, rng), blob(AXES[2], 2, rng),
                         blob(AXES[3], 2, rng)])
    data = PatternInput(vectors, np.zeros_like(vectors), np.array([0] * 10 + [1] * 4),
                        tokens=np.full(14, 100.0), asked=np.array([4.0] * 5 + [1.0] * 9),
                        hits=np.array([3.0] * 5 + [0.0] * 9))
    for method in ("kmeans", "dbscan"):
        model = fit_co_hsc(data, patterns=2, method=method)
        assert len(model) == 4 and sorted(model.rounds) == [0, 0, 1, 1], method
        labels = model.labels
        assert len({*labels[:5]}) == len({*labels[5:10]}) == len({*labels[10:12]}) == 1
        assert len({labels[0], labels[5], labels[10], labels[12]}) == 4
        assert model.ratios[labels[0]] == pytest.approx(0.75)  # 3 hits of 4 asks
        assert model.ranks[labels[0]] == "high" and model.ranks[labels[5]] is None
        assert model.nearest(AXES[0], 0) == labels[0]
        assert model.nearest(AXES[3], 3) == labels[12]  # deeper rounds: the deepest clustered


def test_dbscan_makes_a_pattern_of_each_outlier() -> None:
    rng = np.random.default_rng(1)
    vectors = np.vstack([blob(AXES[0], 4, rng), AXES[3:6]])
    data = PatternInput(vectors, np.zeros_like(vectors), np.zeros(7, dtype=np.int64),
                        np.full(7, 10.0), np.ones(7), np.zeros(7))
    model = fit_co_hsc(data, method="dbscan")
    assert len(model) == 4 and len(set(model.labels[4:])) == 3


def test_se_hsc_splits_later_rounds_only_under_parents_that_survive_pruning() -> None:
    """Round 1 has four topics; topic A saves tokens (ratio 0.5 >= T_s: pruned), B, C and D
    save none. A's and B's follow-ups each come in two sub-topics; only B's are split (into
    ceil(4 / 2) = 2), while CO-HSC splits both."""
    rng = np.random.default_rng(2)
    first = np.vstack([blob(AXES[axis], 4, rng) for axis in range(4)])
    follow = np.vstack([blob(AXES[axis], 3, rng) for axis in range(4, 8)])
    contexts = np.vstack([np.zeros((16, 8)), np.repeat(AXES[[0, 1]], 6, axis=0)])
    data = PatternInput(np.vstack([first, follow]), contexts,
                        np.array([0] * 16 + [1] * 12), np.full(28, 10.0),
                        np.array([2.0] * 4 + [1.0] * 24), np.array([1.0] * 4 + [0.0] * 24))
    model = fit_se_hsc(data, patterns=4, prune_saving=0.2, prune_share=0.05)
    labels = model.labels
    assert all(len({*labels[i:i + 4]}) == 1 for i in range(0, 16, 4))  # the four topics
    assert len({*labels[16:22]}) == 1  # under the pruned parent: one pattern
    assert len({*labels[22:25]} | {*labels[25:28]}) == 2  # under B: split by topic
    assert len(model) == 7 and list(model.rounds).count(1) == 3
    co = fit_co_hsc(data, patterns=4)
    assert len({*co.labels[16:22]}) == 2  # CO-HSC splits A's follow-ups too


# admission --------------------------------------------------------------------------------
def test_admission_stores_everything_while_cold_then_only_mid_and_high_patterns() -> None:
    rng = np.random.default_rng(3)
    vectors = np.vstack([blob(AXES[i], 2, rng) for i in range(4)])
    data = PatternInput(vectors, np.zeros_like(vectors), np.zeros(8, dtype=np.int64),
                        np.full(8, 10.0), np.full(8, 5.0), np.array([4.0, 4, 2, 2, 1, 1, 0, 0]))
    model = fit_co_hsc(data, patterns=4)
    ranks = {int(axis): model.ranks[model.nearest(AXES[axis], 0)] for axis in range(4)}
    assert ranks == {0: "high", 1: "mid", 2: "low", 3: None}
    for axis in range(4):
        assert admits(model, model.nearest(AXES[axis], 0), full=False)
    assert [admits(model, model.nearest(AXES[a], 0), full=True) for a in range(4)] == [
        True, True, False, False]
    assert admits(None, None, full=True)  # no patterns yet
    no_savings = dataclasses.replace(model, ratios=np.zeros(len(model)))
    assert admits(no_savings, model.nearest(AXES[3], 0), full=True)


def test_a_full_scalm_cache_admits_the_popular_pattern_and_evicts_zero_priority_first(
        make_cache: CacheFactory) -> None:
    """Four entries, one popular (3 hits), the rest one-off: after clustering the popular
    one is the only ranked pattern. A one-off like a stored one-off is refused; a question
    like the popular one is stored, and the oldest unranked entry makes room."""
    cache = make_cache(settings=scalm(max_entries=4))
    popular = cache.insert(POPULAR, "Paris.")
    one_offs = [cache.insert(q, "an answer") for q in ONE_OFFS]
    for _ in range(3):
        assert isinstance(cache.lookup(POPULAR), Hit)
    cache.policy.wait()
    state = cache.policy.recluster()
    # the query log: four answered queries and three hits on the popular one
    assert state is not None and state.queries == 7 and len(state.model) == 4
    assert state.model.priority(cache.policy._pattern(popular.embedding, 0,
                                                      popular.encoder_version)) == 3

    refused = cache.insert("How can I bake bread with sourdough starter?", "an answer")
    assert refused.id not in {e.id for e in cache.entries()} and len(cache) == 4
    admitted = cache.insert("What is the capital city of Italy?", "Rome.")
    assert {e.id for e in cache.entries()} == {popular.id, one_offs[1].id, one_offs[2].id,
                                               admitted.id}
    assert cache.stats().evictions == 1


def test_patterns_are_refitted_in_the_background_and_persist(make_cache: CacheFactory,
                                                             tmp_path: Path) -> None:
    cache = make_cache(settings=scalm("scalm-se"))
    for question in [POPULAR, *ONE_OFFS, "Why is the sky blue?", "How tall is Everest?",
                     "Who wrote Hamlet?", "What is a prime number?"]:
        cache.insert(question, "an answer")
    cache.policy.wait()  # 8 inserts: a fit was started by the inserts, off their path
    state = cache.policy.state
    assert state is not None and state.policy == "scalm-se" and state.queries >= 4
    cache.close()
    reopened = make_cache(settings=scalm("scalm-se"))
    loaded = reopened.policy.state
    assert loaded is not None and loaded.queries == state.queries
    assert reopened.policy.logged == 8
    assert loaded.model.ranks == state.model.ranks
    np.testing.assert_allclose(loaded.model.centroids, state.model.centroids)
    assert make_cache(tmp_path / "other", settings=scalm("scalm-co")).policy.state is None
    assert make_cache(settings=scalm("scalm-co")).policy.state is None  # fitted for SE-HSC


def test_an_unreadable_pattern_record_costs_a_refit_not_an_error(tmp_path: Path) -> None:
    store = EntryStore(tmp_path / "store")
    store.set_state("patterns", {"centroids": b"\x00", "dim": "many"})
    store.set_state("pattern_log", {"version": "v"})
    assert load_patterns(store) is None
    assert len(load_log(store, 10)) == 0
    store.close()


def unit(vector: np.ndarray) -> np.ndarray:
    return (vector / np.linalg.norm(vector)).astype(np.float16)


def test_a_popular_query_the_full_cache_refused_is_admitted_once_the_log_sees_it_recur(
        tmp_path: Path) -> None:
    """Two held entries, one hit twice; four one-offs are refused. A new popular question
    first lands nearest an unranked one-off pattern and is refused, but the query log sees
    it recur: after two asks its own pattern saves tokens and ranks mid, so the third ask is
    stored and the held entry with the lowest priority (no rank, no hits) makes room."""
    store = EntryStore(tmp_path / "store")
    policy = CachePolicy(store, PolicySettings("scalm-co", min_events=1, regrow=0))

    def entry(vector: np.ndarray) -> Entry:
        return Entry("q", "a", unit(vector), "v", query_tokens=10, answer_tokens=10)

    def ask(asked: Entry) -> bool:
        admitted = policy.admits(asked, full=True)
        policy.asked(asked, threshold=0.9)
        policy.wait()
        if admitted:
            policy.track(asked)
        return admitted

    held = [entry(AXES[0]), entry(AXES[1])]
    for held_entry in held:
        policy.track(held_entry)
        policy.asked(held_entry, threshold=0.9)
    for _ in range(2):
        policy.hit(held[0].id)
        policy.wait()
    one_offs = [entry(AXES[axis] + 0.3 * AXES[1]) for axis in (2, 3, 4, 5)]  # near held[1]
    assert [ask(asked) for asked in one_offs] == [False] * 4
    popular = [entry(AXES[6] + 0.3 * AXES[3]) for _ in range(3)]
    assert [ask(asked) for asked in popular] == [False, False, True]
    usage = {e.id: (e.created, e.nbytes) for e in [*held, popular[2]]}
    assert policy.victims(usage, over_count=1, over_bytes=0) == [held[1].id]
    policy.close()
    store.close()


# switching and refusing -------------------------------------------------------------------
@pytest.mark.parametrize("policy", ["lfu", "scalm-co", "scalm-se", "lru"])
def test_switching_the_policy_keeps_every_entry(make_cache: CacheFactory, policy: str) -> None:
    first = make_cache(settings=CacheSettings(eviction_policy="scalm-co"))
    stored = {first.insert(q, f"answer to {q}").id for q in [POPULAR, *ONE_OFFS]}
    first.close()
    cache = make_cache(settings=CacheSettings(eviction_policy=policy))
    assert {e.id for e in cache.entries()} == stored
    for question in [POPULAR, *ONE_OFFS]:
        assert isinstance(cache.lookup(question), Hit)


def test_an_unknown_policy_is_refused_by_name(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match="eviction_policy 'fifo' is unknown; valid: lru, lfu, "
                                         "scalm-co, scalm-se"):
        CacheSettings(eviction_policy="fifo")
    with pytest.raises(ValueError, match="pattern_clustering 'optics'.*kmeans, dbscan"):
        CacheSettings(pattern_clustering="optics")
    env = {"MEANCACHE_EVICTION_POLICY": "fifo"}
    with pytest.raises(ConfigError, match="'fifo' is unknown; valid: lru, lfu"):
        load_settings(config_dir=tmp_path, environ=env)
    assert main(["--config-dir", str(tmp_path), "--data-dir", str(tmp_path / "d"),
                 "--eviction-policy", "mru", "cache", "stats"]) == 2
    assert "eviction_policy 'mru' is unknown; valid: lru, lfu, scalm-co, scalm-se" in \
        capsys.readouterr().err.replace("\n", "")


def test_policy_setting_from_config_environment_and_flag(tmp_path: Path) -> None:
    assert load_settings(config_dir=tmp_path, environ={}).eviction_policy == "lru"
    (tmp_path / "config.toml").write_text('eviction_policy = "lfu"\n')
    assert load_settings(config_dir=tmp_path, environ={}).eviction_policy == "lfu"
    env = {"MEANCACHE_EVICTION_POLICY": "scalm-se", "MEANCACHE_PATTERN_CLUSTERING": "dbscan"}
    settings = load_settings(config_dir=tmp_path, environ=env)
    assert (settings.cache_settings().eviction_policy,
            settings.cache_settings().pattern_clustering) == ("scalm-se", "dbscan")
    flagged = load_settings(config_dir=tmp_path, environ=env, eviction_policy="scalm-co")
    assert flagged.cache_settings().eviction_policy == "scalm-co"


# stats ------------------------------------------------------------------------------------
def test_stats_report_hit_rate_and_token_saving_ratio(
        data_dir: Path, encoder: Encoder, capsys: pytest.CaptureFixture[str]) -> None:
    settings = load_settings()
    with SemanticCache(settings.cache_dir, encoder, settings.cache_settings()) as cache:
        cache.insert(POPULAR, "Paris.", query_tokens=10, answer_tokens=30)
        cache.insert(ONE_OFFS[0], "Knead, prove, bake.", query_tokens=20, answer_tokens=140)
        assert isinstance(cache.lookup(POPULAR), Hit)
        assert isinstance(cache.lookup("Who painted the Mona Lisa?"), Miss)
        stats = cache.stats()
    # saved 40 of 40 (hit) + 40 + 160 (the two upstream answers) tokens; 1 hit of 2 lookups
    assert stats.token_saving_ratio == pytest.approx(40 / 240)
    assert main(["cache", "stats", "--json"]) == 0
    reported = json.loads(capsys.readouterr().out)
    assert reported["hit_rate"] == 0.5
    assert reported["token_saving_ratio"] == pytest.approx(40 / 240)
    assert (reported["tokens_saved"], reported["tokens_upstream"]) == (40, 200)
    rows = dict(stats_rows(stats, None))
    assert rows["hit rate"].startswith("50.0%")
    assert rows["token saving ratio"] == "16.7% of 240 answered tokens"


def test_empty_stats_have_zero_ratios() -> None:
    fields = {f.name: 0 for f in dataclasses.fields(CacheStats)} | {
        "local_threshold": None, "encoder_version": "-", "encoder_backend": "onnx"}
    stats = CacheStats(**fields)  # type: ignore[arg-type]
    assert (stats.hit_rate, stats.token_saving_ratio) == (0.0, 0.0)
