"""`meancache ask` in-process against a real upstream (builtin:tiny on loopback): what it
prints, and the conversation it saves and continues."""

import json
import re
from pathlib import Path

import pytest
from meancache.client.chat.conversations import ConversationStore
from meancache.client.tui.text import printable

from meancache.cli import main

QUESTION = "How do I reverse a list in Python?"
PARAPHRASE = "how can I reverse a python list?"
UPSTREAM_LINE = re.compile(r"\n\n\[upstream · first token \d+ ms · \d+ prompt tokens reused; "
                           r"conversation ([0-9a-f]{12})\]\n\Z")


def test_ask_prints_saves_and_continues(data_dir: Path, upstream_url: str,
                                        capsys: pytest.CaptureFixture[str]) -> None:
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
