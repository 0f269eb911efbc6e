"""The stream replay (`eval replay --learn`): questions grouped by their duplicate pairs in
a seeded order, a miss labelled by comparing answers and made an alias when they agree,
the learned decision and the static one counted on the same stream, and the command's
report."""

import json
import random
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import pytest
from meancache.client.cache import CacheSettings, SemanticCache
from meancache.client.cache.store import EntryStore
from meancache.client.eval_stream import Turn, replay, stream_of
from meancache.client.learning.state import Learned
from meancache.shared.pairs import Pair
from meancache.shared.verifier.runtime import LearnedVerifier, read_card

from meancache.cli import main
from tests.support.tiny_verifier import built_tiny_verifier

FRANCE = "What is the capital of France?"
PARAPHRASE = "Which city is the capital of France?"


def test_groups_follow_duplicate_pairs_and_the_seed_orders_them() -> None:
    pairs = [Pair("a b", "A B?", 1), Pair("A B?", "c d", 1), Pair("e f", "g h", 0)]
    seed = random.randrange(2**32)
    print("seed", seed)
    turns = stream_of(pairs, seed)
    assert stream_of(pairs, seed) == turns
    groups = {t.question: t.group for t in turns}
    assert len(turns) == 4  # "a b" and "A B?" are one question once normalised
    assert groups["c d"] == groups[next(q for q in groups if q.lower().startswith("a b"))]
    assert groups["e f"] != groups["g h"]


def test_the_replay_learns_an_alias_that_survives_and_the_static_decision_does_not(
        make_cache: Callable[..., SemanticCache], tmp_path: Path,
        tmp_path_factory: pytest.TempPathFactory) -> None:
    # tau low enough that the questions reach the verifier, a tiny real one whose card
    # declines everything: the paraphrase is a miss whose candidate the upstream's answer
    # (the same for the whole group) labels
    directory = built_tiny_verifier(tmp_path_factory, threshold=1.0 - 1e-9)
    verifier = LearnedVerifier(directory / "verifier.onnx", read_card(directory))
    settings = CacheSettings(global_threshold=0.3, pca_dims=0)
    turns = [Turn(FRANCE, 0), Turn(PARAPHRASE, 0), Turn(PARAPHRASE.lower().rstrip("?"), 0),
             Turn("How long do I boil an egg?", 1)]
    learning = make_cache(tmp_path / "learned", settings=settings, verifier=verifier)
    tally = replay(learning, turns)
    assert tally.outcomes == ["miss", "miss", "right", "miss"]
    assert tally.upstream == 3
    # the most a cache could serve: the two questions asked after their group's first
    report = tally.report()
    assert report["whole"]["ceiling"] == 0.5 and report["last_half"]["ceiling"] == 0.5
    learning.close()
    with closing(EntryStore(tmp_path / "learned")) as store:
        again = Learned(store, 0.02)
        assert again.alias(PARAPHRASE) is not None
        assert len(again.labels) >= 1 and not again.labels[0].wrong
    static = make_cache(tmp_path / "static", settings=settings, verifier=verifier,
                        learns=False)
    # the third question is the stored second one once normalised: served by identity
    assert replay(static, turns).outcomes == ["miss", "miss", "right", "miss"]
    assert static.learned.labels == [] and static.learned.alias(PARAPHRASE) is None


def test_replay_learn_reports_both_decisions(data_dir: Path, tmp_path: Path,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    rows = [{"q1": FRANCE, "q2": PARAPHRASE, "label": 1},
            {"q1": "How do I bake sourdough bread?", "q2": "Who won the 1998 World Cup?",
             "label": 0}]
    path = tmp_path / "stream.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "replay", str(path), "--learn", "--seed", "3", "--verifier", "none",
                 "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["seed"] == 3 and report["questions"] == 4
    # the paraphrase's candidate, explored or declined, is labelled by the simulated
    # upstream's answer (whatever upstream the device's settings name: here none)
    assert report["labels"] >= 1
    assert report["closed"] is (report["threshold"] > 1)  # a threshold no score reaches
    for decision in ("static", "learned"):
        whole = report[decision]["whole"]
        assert whole["right"] + whole["wrong"] + whole["miss"] == 4
        assert whole["wrong"] == 0  # nothing here is alike but the one paraphrase
        assert whole["ceiling"] == 0.25  # the paraphrase's group alone is asked again


def test_cache_reset_learning_forgets_only_the_learning(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from meancache.client.config import load_settings
    from meancache.client.learning.bound import Label

    cache_dir = load_settings().cache_dir
    cache_dir.mkdir(parents=True, exist_ok=True)
    with closing(EntryStore(cache_dir)) as store:
        store.set_meta("kept", 1)
        Learned(store, 0.02, 0.5).learn(Label(0.4, False, entry="e"), FRANCE)
    assert main(["cache", "reset-learning"]) == 0
    said = capsys.readouterr().out
    assert "forgot what the cache learned (2 records: labels, aliases, bound)" in said
    assert main(["cache", "reset-learning"]) == 0  # nothing left to forget
    assert "(0 records:" in capsys.readouterr().out
    with closing(EntryStore(cache_dir)) as store:
        assert Learned(store, 0.02, 0.5).labels == []
        assert Learned(store, 0.02, 0.5).alias(FRANCE) is None
        assert store.get_meta("kept") == 1
