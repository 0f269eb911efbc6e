"""`meancache ask` in-process against a real upstream (builtin:tiny on loopback): what it
prints, and the conversation it saves and continues."""

import json
import re
from pathlib import Path

import pytest
from meancache.client.chat.conversations import ConversationStore
from meancache.client.tui.text import printable

from meancache.cli import main
from tests.support.servers import RECEIVED, free_port, module_tokens, scripted_upstream

QUESTION = "How do I reverse a list in Python?"
PARAPHRASE = "how can I reverse a python list?"
UPSTREAM_LINE = re.compile(r"\n\n\[upstream · first token \d+ ms · \d+ prompt tokens reused; "
                           r"conversation ([0-9a-f]{12})\]\n\Z")


def test_ask_prints_saves_and_continues(data_dir: Path, upstream_url: str,
                                        capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # a test of a hit must not draw: with an upstream named the cache learns, and a near
    # would-be hit may be explored (sent upstream) until its labels settle
    monkeypatch.setenv("MEANCACHE_EXPLORE_RATE", "0")
    assert main(["ask", QUESTION, "--upstream", upstream_url]) == 0
    out = capsys.readouterr().out
    found = UPSTREAM_LINE.search(out)
    assert found is not None, out
    conversation_id = found.group(1)
    store = ConversationStore(data_dir / "conversations")
    saved = store.load(conversation_id)
    assert saved.title == QUESTION
    assert [(t.question, t.source) for t in saved.turns] == [(QUESTION, "upstream")]
    answer = saved.turns[0].answer
    assert out[:found.start()] == printable(answer)  # streamed, control bytes replaced

    assert main(["ask", PARAPHRASE, "--upstream", upstream_url, "--json",
                 "--conversation", conversation_id]) == 0
    reply = json.loads(capsys.readouterr().out)
    assert reply["answer"] == answer
    assert (reply["source"], reply["matched_query"]) == ("cache", QUESTION)
    assert reply["conversation"] == conversation_id
    assert 0.869 <= reply["similarity"] < 1.0
    assert (reply["ttft_ms"], reply["cached_tokens"]) == (None, 0)
    saved = store.load(conversation_id)
    assert [(t.question, t.source) for t in saved.turns] == [
        (QUESTION, "upstream"), (PARAPHRASE, "cache")]

    assert main(["ask", QUESTION, "--upstream", upstream_url,
                 "--conversation", conversation_id]) == 0
    out = capsys.readouterr().out
    assert out == (f"{printable(answer)}\n\n[cache · similarity 1.00 · matched “{QUESTION}”; "
                   f"conversation {conversation_id}]\n")
    assert len(store.load(conversation_id).turns) == 3
    assert [c.id for c in store.list()] == [conversation_id]


def test_ask_in_an_unknown_conversation_fails_clearly(
        data_dir: Path, upstream_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ask", QUESTION, "--upstream", upstream_url,
                 "--conversation", "feedc0ffee42"]) == 2
    captured = capsys.readouterr()
    assert "error:" in captured.err and "no conversation 'feedc0ffee42'" in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""
    assert list((data_dir / "conversations").glob("*.json")) == []


def test_ask_takes_a_v1_base_url_and_checks_the_model_first(
        data_dir: Path, upstream_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ask", QUESTION, "--upstream", f"{upstream_url}/v1/", "--json",
                 "--model", "builtin:tiny"]) == 0
    assert json.loads(capsys.readouterr().out)["source"] == "upstream"
    assert main(["ask", QUESTION, "--upstream", f"{upstream_url}/v1",
                 "--model", "gpt-4o"]) == 2
    captured = capsys.readouterr()
    assert captured.err.count("\n") == 1 and captured.out == ""
    assert f"the upstream at {upstream_url}/v1 does not serve the model 'gpt-4o'; it serves: " \
           "builtin:tiny" in captured.err.replace("\n", "")


def test_ask_reads_openai_base_url_when_nothing_names_an_upstream(
        data_dir: Path, upstream_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", f"{upstream_url}/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "unused-by-this-server")
    assert main(["ask", QUESTION, "--json"]) == 0  # no embedded upstream was started
    assert json.loads(capsys.readouterr().out)["source"] == "upstream"


def test_ask_shows_an_empty_answer_with_the_finish_reason(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with scripted_upstream() as stub:
        assert main(["ask", QUESTION, "--upstream", f"{stub}/empty/v1"]) == 0
        out = capsys.readouterr().out
        assert main(["ask", QUESTION, "--upstream", f"{stub}/locked/v1"]) == 2
        refused = capsys.readouterr().err.replace("\n", "")
    assert out.startswith(" \n(empty answer; the server stopped: stop)\n\n[upstream · ")
    assert f"the upstream at {stub}/locked/v1 refused the API key (401" in refused


def test_ask_warns_of_an_unreachable_upstream_and_still_answers_from_the_cache(
        data_dir: Path, upstream_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ask", QUESTION, "--upstream", upstream_url]) == 0
    capsys.readouterr()
    gone = f"http://127.0.0.1:{free_port()}/v1"
    assert main(["ask", QUESTION, "--upstream", gone, "--json"]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["source"] == "cache"
    assert captured.err.replace("\n", "").startswith(
        f"warning: cannot reach the upstream at {gone} (")
    assert "answering from the cache only" in captured.err.replace("\n", "")


def test_ask_sends_the_configured_temperature_and_answer_length(
        data_dir: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    RECEIVED.clear()
    with scripted_upstream() as stub:
        assert main(["ask", QUESTION, "--upstream", f"{stub}/ok"]) == 0
        monkeypatch.setenv("MEANCACHE_TEMPERATURE", "0.3")
        monkeypatch.setenv("MEANCACHE_ANSWER_MAX_TOKENS", "7")
        assert main(["ask", "What is the capital of France?", "--upstream", f"{stub}/ok"]) == 0
    capsys.readouterr()
    sent = [(body["temperature"], body["max_tokens"]) for body in RECEIVED]
    assert sent == [(0.0, 512), (0.3, 7)]  # the documented defaults, then the configured ones


DOCUMENT = ("The ferry leaves the north pier at seven and at noon; tickets are sold on "
            "board, and bicycles travel free on the first crossing of the day.")


def test_ask_marks_an_attached_document_for_a_meancache_upstream_to_keep(
        data_dir: Path, upstream_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """As the chat sends documents: a marked system message (client.chat.documents) that
    the upstream keeps as a module and reads back for the next question (its /metrics:
    module tokens, not prefix blocks), attached once however often it is named."""
    document = tmp_path / "ferry.txt"
    document.write_text(DOCUMENT, encoding="utf-8")
    assert main(["ask", "When does the ferry leave?", "--document", str(document),
                 "--upstream", upstream_url, "--json"]) == 0
    first = json.loads(capsys.readouterr().out)
    assert first["source"] == "upstream"
    before = module_tokens(upstream_url)
    assert main(["ask", "Do bicycles pay?", "--document", str(document), "--upstream",
                 upstream_url, "--json", "--conversation", first["conversation"]]) == 0
    second = json.loads(capsys.readouterr().out)
    assert second["source"] == "upstream"  # a question about documents: never the cache
    kept = len(f"{document.name}:\n{DOCUMENT}\n".encode())  # builtin:tiny reads bytes
    assert module_tokens(upstream_url) - before >= kept
    assert second["cached_tokens"] >= kept
    saved = ConversationStore(data_dir / "conversations").load(first["conversation"])
    assert [d.path for d in saved.documents] == [str(document.resolve())]


def test_ask_refuses_a_document_it_cannot_read_by_name(
        data_dir: Path, upstream_url: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nowhere.txt"
    assert main(["ask", QUESTION, "--document", str(missing), "--upstream", upstream_url]) == 2
    captured = capsys.readouterr()
    assert f"no file {missing}" in captured.err.replace("\n", "")
    assert "Traceback" not in captured.err and captured.out == ""
    assert list((data_dir / "conversations").glob("*.json")) == []


@pytest.mark.parametrize(("extra", "said"), [
    ([" ", "\n"], "query is empty"),
    ([QUESTION, "--conversation", "feedc0ffee42"], "no conversation 'feedc0ffee42'"),
    ([QUESTION, "--document", "no-such-file.txt"], "no file no-such-file.txt"),
])
def test_what_ask_refuses_is_refused_before_anything_starts(
        data_dir: Path, extra: list[str], said: str,
        capsys: pytest.CaptureFixture[str]) -> None:
    before = sorted(path.name for path in data_dir.iterdir() if path.name != "logs")
    assert main(["ask", *extra]) == 2  # no upstream named: the embedded one would start
    assert said in capsys.readouterr().err
    # no embedded upstream was started for it, nor a cache opened
    assert sorted(path.name for path in data_dir.iterdir()
                  if path.name not in ("logs", "conversations")) == before
