"""The `meancache` command line, run in-process against a real cache in a temp data dir."""

import argparse
import json
import math
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import numpy as np
import pytest
from meancache.client.cache import SemanticCache
from meancache.client.cache.store import EntryStore
from meancache.client.config import load_settings
from meancache.client.encoder import load_device_encoder
from meancache.client.learning.state import set_pooled
from meancache.shared.encoder import Encoder
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.processes import free_port
from meancache.shared.verifier.runtime import ARTEFACT_DIR, read_card

from meancache.cli import build_parser, main
from tests.support.paths import DATA_DIR

DATA = DATA_DIR


def dev_pairs(n: int) -> list[dict[str, object]]:
    rows = []
    with (DATA / "qqp" / "pairs.jsonl").open() as fh:
        for line in fh:
            row = json.loads(line)
            if row["split"] == "dev":
                rows.append(row)
                if len(rows) == n:
                    break
    return rows


def test_eval_pairs_json_matches_an_independent_computation(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dev = dev_pairs(40)
    train = [{"q1": "train only", "q2": "never counted", "label": 1, "split": "train"}]
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in dev + train))

    assert main(["eval", "pairs", str(path), "--split", "dev", "--json",
                 "--threshold", "0.8"]) == 0
    report = json.loads(capsys.readouterr().out)

    encoder = load_device_encoder(load_settings())  # the one the command ran
    a = encoder.encode([r["q1"] for r in dev])
    b = encoder.encode([r["q2"] for r in dev])
    predicted = (a * b).sum(1) >= 0.8
    labels = np.array([r["label"] for r in dev]).astype(bool)
    tp = int((predicted & labels).sum())
    assert report["pairs"] == len(dev)
    assert report["threshold"] == pytest.approx(0.8)
    assert report["precision"] == pytest.approx(tp / max(predicted.sum(), 1), abs=1e-9)
    assert report["recall"] == pytest.approx(tp / labels.sum(), abs=1e-9)
    assert report["accuracy"] == pytest.approx((predicted == labels).mean(), abs=1e-9)
    for key in ("f1", "f05"):
        assert 0.0 <= report[key] <= 1.0
    assert [s["threshold"] for s in report["sweep"]][:2] == pytest.approx([0.5, 0.55])


def test_eval_pairs_uses_the_cache_threshold_by_default(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in dev_pairs(5)))
    monkeypatch.setenv("MEANCACHE_THRESHOLD", "0.77")
    assert main(["eval", "pairs", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["threshold"] == pytest.approx(0.77)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"q1": "a", "q2": "b", "label": 1}\n{"q1": "a", "label": 0}\n', ":2: 'q2'"),
        ('{"q1": "a", "q2": "b", "label": 3}\n', "'label' must be 0 or 1"),
        ("not json\n", ":1: not valid JSON"),
        ('{"q1": "a", "q2": "b", "label": 1, "split": "train"}\n', "no pairs with split 'dev'"),
    ],
)
def test_eval_pairs_bad_file_is_a_clear_error(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str,
    message: str,
) -> None:
    path = tmp_path / "bad.jsonl"
    path.write_text(content)
    assert main(["eval", "pairs", str(path), "--split", "dev"]) == 2
    captured = capsys.readouterr()
    assert message in captured.err.replace("\n", " ")
    assert "Traceback" not in captured.err


def test_missing_pairs_file(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "pairs", "/nonexistent/pairs.jsonl"]) == 2
    assert "cannot read /nonexistent/pairs.jsonl" in capsys.readouterr().err


def test_unknown_model_name_says_nothing_is_downloaded(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--encoder", "all-MiniLM-L12-v2", "cache", "demo"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "never downloads models" in err
    assert "--encoder" in err


def fill_cache(data_dir: Path, questions: list[str]) -> None:
    settings = load_settings()
    encoder = load_device_encoder(settings)
    with SemanticCache(settings.cache_dir, encoder, settings.cache_settings()) as cache:
        for question in questions:
            cache.insert(question, f"answer to {question}")
        cache.lookup(questions[0])


def test_stats_list_export_clear(
    data_dir: Path, tmp_path: Path, encoder: Encoder, capsys: pytest.CaptureFixture[str]
) -> None:
    questions = ["What is the capital of France?", "How do I boil an egg?"]
    fill_cache(data_dir, questions)

    assert main(["cache", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["entries"], stats["hits"], stats["misses"]) == (2, 1, 0)
    assert stats["hit_rate"] == 1.0
    # read from the stored vectors, without loading the encoder
    assert (stats["encoder_version"], stats["embedding_dim"]) == (encoder.version, encoder.dim)
    assert stats["stale_entries"] == 0

    assert main(["cache", "list", "--json"]) == 0
    listed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [row["query"] for row in listed] == questions
    assert "embedding" not in listed[0]

    out = tmp_path / "export.jsonl"
    assert main(["cache", "export", str(out)]) == 0
    exported = [json.loads(line) for line in out.read_text().splitlines()]
    assert {row["answer"] for row in exported} == {f"answer to {q}" for q in questions}
    assert {row["cache"] for row in exported} == {"chat"}
    assert "exported 2 entries" in " ".join(capsys.readouterr().err.split())

    assert main(["cache", "clear"]) == 2  # no terminal to confirm on, and no --yes
    assert "without --yes" in capsys.readouterr().err
    assert main(["cache", "clear", "--yes"]) == 0
    assert "deleted 2 entries" in capsys.readouterr().out
    assert main(["cache", "list"]) == 0
    assert "no cached answers yet" in capsys.readouterr().out  # not an empty table
    assert main(["cache", "stats", "--json"]) == 0
    assert json.loads(capsys.readouterr().out.splitlines()[-1])["entries"] == 0


def test_stats_say_how_many_pooled_labels_back_the_bound(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A device that installed the federation's pooled error-bound evidence (and has no
    label of its own) is told the bound rests on it."""
    with closing(EntryStore(load_settings().cache_dir)) as store:
        set_pooled(store, BoundEvidence.of_labels(  # scored by the shipped verifier
            np.linspace(0.3, 0.5, 400), np.zeros(400), np.ones(400)).judged_by(
                read_card(ARTEFACT_DIR).judge))
    assert main(["cache", "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert stats["wrong_rate_labels"] == stats["wrong_rate_pooled"] > 0
    assert main(["cache", "stats"]) == 0
    out = " ".join(capsys.readouterr().out.replace("│", " ").split())  # cells wrap
    assert f"{stats['wrong_rate_pooled']} of them not this device's" in out
    # each fact once, as the stats screen says it: no raw field beside its readable row
    assert "served from (judge's score)" in out and "similarity threshold (tau)" in out
    assert "wrong rate upper" not in out and "serves from" not in out


def test_demo_shows_hits_and_misses(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "demo"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "Cached 4 answers; threshold tau = 0.869" in out
    # The same question, both paraphrases and the follow-up in its own context hit; the
    # unrelated question and the follow-up in another context miss.
    assert "hits 4, misses 2, entries 4," in out
    assert "another context" in out  # the reason of the second miss (wrapped in its cell)
    assert (data_dir / "demo-cache").is_dir()
    assert not (data_dir / "cache").exists()  # the demo never touches the real cache


def test_logs_go_to_the_data_dir(data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["cache", "stats"]) == 0
    assert (data_dir / "logs" / "meancache.log").is_file()
    assert "INFO" not in capsys.readouterr().err


def test_repair_moves_a_damaged_cache_aside(
    data_dir: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    fill_cache(data_dir, ["one question", "another question"])
    db = data_dir / "cache" / "cache.db"
    db.write_bytes(b"this is not a database" * 100)
    assert main(["cache", "stats"]) == 2
    assert "meancache cache repair" in " ".join(capsys.readouterr().err.split())
    assert main(["cache", "repair"]) == 0
    said = " ".join(capsys.readouterr().out.split())
    assert "moved the cache to" in said and "its database did not open" in said
    aside = [p for p in data_dir.iterdir() if p.name.startswith("cache.before-repair-")]
    assert len(aside) == 1 and (aside[0] / "cache.db").is_file()
    assert main(["cache", "stats", "--json"]) == 0


def _commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
              ) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:  # argparse exposes subcommands only this way
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def test_every_device_and_upstream_option_says_its_default() -> None:
    checked = 0
    for path, parser in _commands(build_parser()):
        if path[:1] not in (("cache",), ("chat",), ("ask",), ("eval",), ("upstream",)):
            continue
        for action in parser._actions:
            if not action.option_strings or isinstance(
                    action, argparse._HelpAction | argparse._StoreTrueAction):
                continue  # flags are off unless given
            help_text = parser.formatter_class(prog="x")._expand_help(action)
            assert "(default: " in help_text, (path, action.option_strings)
            checked += 1
    assert checked >= 15


def test_eval_pairs_measures_the_whole_decision_with_the_chosen_verifier(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The decision row is Matcher.decide's; with ``--verifier learned`` (the default): the
    recall tau, then the shipped verifier's probability, judged by the learned decision's
    card (the default) or by the verifier's threshold (``decision = "rules"``, and
    "learned" with a card fitted on another encoder than the tests' MiniLM: the shipped
    one, fitted on MPNet), then the rule checks kept beside it. Each pair is a lone
    candidate, so the card's features are computed here from their definitions, not by
    the matcher's code."""
    from meancache.client.matching.matcher import shipped_verifier
    from meancache.client.matching.question import embed_texts
    from meancache.client.matching.rules import WITH_LEARNED, verify
    from meancache.client.matching.settings import RECALL_MARGIN
    from meancache.shared.verifier.decision import CARD_PATH

    from tests.support.decision_card import use_card_for

    dev = dev_pairs(40)
    path = tmp_path / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in dev))
    assert main(["eval", "pairs", str(path), "--json", "--verifier", "rules"]) == 0
    assert json.loads(capsys.readouterr().out)["decision"]["verifier"] == "rules"

    encoder = load_device_encoder(load_settings())  # the one the command ran
    a = embed_texts(encoder, [r["q1"] for r in dev])  # normalised, as every match embeds
    b = embed_texts(encoder, [r["q2"] for r in dev])
    verifier = shipped_verifier()
    card = json.loads(CARD_PATH.read_text())
    weights = dict(zip(card["features"], card["coefficients"], strict=True))

    def logit(p: float) -> float:
        p = min(max(p, 1e-4), 1 - 1e-4)  # the card's clip: a missing runner-up reads as 1e-4
        return math.log(p / (1 - p))

    def learned(cosine: float, p: float, tau: float) -> bool:
        lone = {"logit_p1": logit(p), "logit_gap": logit(p) - logit(0.0), "p2": 0.0,
                "cos_pick": cosine, "cos_nearest_gap": 0.0,
                "cos_margin": cosine - (tau - RECALL_MARGIN), "pick_is_nearest": 1.0,
                "count": 1.0, "count_over": float(p >= verifier.threshold)}
        score = card["intercept"] + sum(weights[k] * v for k, v in lone.items())
        return 1 / (1 + math.exp(-score)) >= card["threshold"]

    labels = np.array([r["label"] for r in dev]).astype(bool)
    for decision_setting, card_fits in (("rules", False), ("learned", False),
                                        ("learned", True)):
        monkeypatch.setenv("MEANCACHE_DECISION", decision_setting)
        if card_fits:
            use_card_for(encoder.base_version, monkeypatch)
        assert main(["eval", "pairs", str(path), "--json"]) == 0
        decision = json.loads(capsys.readouterr().out)["decision"]
        assert decision["verifier"] == "learned"
        tau = decision["threshold"]
        served = []
        for r, va, vb in zip(dev, a, b, strict=True):
            cosine = float(va @ vb)
            p = float(verifier.probabilities(r["q2"], [r["q1"]])[0])
            judged = learned(cosine, p, tau) if card_fits else p >= verifier.threshold
            served.append(cosine >= tau - RECALL_MARGIN and judged
                          and verify(r["q2"], r["q1"], WITH_LEARNED) is None)
        hits = np.array(served)
        tp = int((hits & labels).sum())
        assert decision["precision"] == pytest.approx(tp / max(hits.sum(), 1), abs=1e-9)
        assert decision["recall"] == pytest.approx(tp / labels.sum(), abs=1e-9)


def test_eval_replay_counts_right_wrong_and_miss(
    data_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rows = [
        {"q1": "What is the capital of France?", "q2": "what is the capital of france",
         "label": 1},  # the same question: served by identity, its own answer
        {"q1": "How do I bake sourdough bread?", "q2": "Who won the 1998 World Cup?",
         "label": 0},  # nothing alike: a miss
        {"q1": "How do I bake sourdough bread?", "q2": "How do I bake sourdough bread?",
         "label": 0},  # served, but labelled another question: wrong
    ]
    path = tmp_path / "replay.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert main(["eval", "replay", str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["stored"], report["right"], report["wrong"], report["miss"]) == (2, 1, 1, 1)
    assert report["hit_precision"] == pytest.approx(0.5)
    assert report["hit_rate"] == pytest.approx(2 / 3)
    assert main(["eval", "replay", str(tmp_path / "missing.jsonl")]) == 2
    assert "cannot read" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["upstream", "serve", "--port"], ["proxy", "--port"],
                                     ["fl", "join", "--port"], ["fl", "server", "--model-port"]])
@pytest.mark.parametrize(("port", "said"), [("0", "0 is not a port; give one from 1 to 65535"),
                                            ("65536", "65536 is not a port"),
                                            ("http", "'http' is not a port number")])
def test_a_port_outside_1_to_65535_is_refused_before_anything_starts(
        command: list[str], port: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:  # argparse's usage error, before any model loads
        build_parser().parse_args([*command, port])
    assert exited.value.code == 2
    assert said in capsys.readouterr().err


UNREACHABLE = "http://127.0.0.1:9/v1"  # nothing listens: a request there is refused


@pytest.mark.parametrize(("argv", "said"), [
    (["ask", "--upstream", "http://127.0.0.1:9/\udcff", "hi"], "argument --upstream"),
    (["ask", "--upstream", UNREACHABLE, "--api-key=k\udcff", "hi"], "argument --api-key"),
    (["ask", "--upstream", UNREACHABLE, "--model", "m\udcff", "hi"], "argument --model"),
    (["ask", "--upstream", UNREACHABLE, "wh\udcff"], "argument question"),
    (["upstream", "serve", "--model", "builtin:tiny", "--api-key", "k\udcff"],
     "argument --api-key"),
    (["pack", "update", "--upstream", "http://127.0.0.1:9/\udcff"], "argument --upstream"),
], ids=["url", "api-key", "model", "question", "server-key", "pack-url"])
def test_an_argument_with_a_byte_that_is_not_utf8_is_named(
        data_dir: Path, argv: list[str], said: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """Python keeps a byte the locale cannot decode ("\\xff" in a shell) as a lone
    surrogate; httpx (URL, header, JSON body) and the server's key hash each ended in a
    UnicodeEncodeError traceback on it."""
    assert main(argv) == 2
    assert f"error: {said}: holds the byte 0xff, which is not UTF-8 text" in \
        " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("variable", ["MEANCACHE_UPSTREAM_API_KEY", "OPENAI_BASE_URL"])
def test_an_environment_variable_with_a_byte_that_is_not_utf8_is_named(
        data_dir: Path, variable: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv(variable, "http://127.0.0.1:9/\udcff")  # os.environ's own decoding
    monkeypatch.delenv("MEANCACHE_UPSTREAM_URL", raising=False)
    assert main(["ask", "hi"]) == 2
    assert f"error: {variable} holds the byte 0xff, which is not UTF-8 text" in \
        " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("command", [
    ["upstream", "serve", "--model", "builtin:tiny"],
    ["proxy", "--upstream", "http://127.0.0.1:9/v1"],
    ["fl", "server"],
])
@pytest.mark.parametrize(("host", "said"), [
    ("", "--host is empty; give an address of this machine"),  # was every interface
    ("what\udcff", "argument --host: holds the byte 0xff"),  # argv's \xff
    ("é" * 64 + ".example", "not a host name or address (encoding of hostname failed)"),
    ("a\x00b", "cannot listen on 'a\\x00b': not a host name or address"),
], ids=["empty", "undecodable", "long-label", "nul"])
def test_a_host_that_is_no_address_is_refused_in_words(
        data_dir: Path, command: list[str], host: str, said: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    """An undecodable or NUL host ended in a TypeError or ValueError traceback, and an empty
    one served on every interface."""
    assert main([*command, "--host", host, "--port", str(free_port())]) == 2
    assert said in " ".join(capsys.readouterr().err.split())


@pytest.mark.parametrize("command", [
    ["upstream", "serve", "--model", "builtin:tiny", "--port"],
    ["proxy", "--upstream", "http://127.0.0.1:9/v1", "--port"],  # nothing there: never asked
    ["fl", "server", "--port"],
])
def test_a_port_in_use_is_said_before_anything_loads_or_starts(
        data_dir: Path, command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    """uvicorn binding the port itself logged the error to the log file and exited, after
    the start line had said "serving" (and after the model or the encoder had loaded)."""
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = sorted(path.name for path in data_dir.iterdir() if path.name != "logs")
        assert main([*command, str(port)]) == 2
    said = " ".join(capsys.readouterr().err.split())
    assert f"cannot listen on 127.0.0.1:{port}: another program listens on it" in said
    assert "serving" not in said
    # nothing was started or assembled for it: no encoder, cache, SuperLink state
    assert sorted(path.name for path in data_dir.iterdir() if path.name != "logs") == before
