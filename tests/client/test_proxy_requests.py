"""What the proxy makes of a request: which ones the cache may answer (eligibility), and
what each body gets from the running proxy in front of the real upstream (property tests:
a valid request its answer, a broken one a 4xx that names the problem, never a 5xx)."""

import json
import signal
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import given
from meancache.client.proxy.eligibility import Bypass, Question, answer_budget, question_of
from meancache.client.proxy.service import Proxy, own_address_problem
from meancache.client.proxy.wire import ChatRequest
from meancache.upstream.sampling_params import SERVER_DEFAULTS
from meancache.upstream.server.app import ServerSettings
from pydantic import ValidationError

from meancache.cli import main
from tests.client.test_proxy import ANSWER_TOKENS, MODEL, proxy_settings
from tests.support.fuzz import chat_bodies, chat_requests, fuzzed, openai_error
from tests.support.servers import running_upstream


def request(**fields: Any) -> ChatRequest:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Why?"}]} | fields
    return ChatRequest.model_validate_json(json.dumps(body))


def decide(greedy_only: bool = False, **fields: Any) -> Question | Bypass:
    return question_of(request(**fields), MODEL, greedy_only)


@pytest.mark.parametrize(("fields", "reason"), [
    ({"functions": [{"name": "f"}]}, "tools"),
    ({"tool_choice": "auto"}, "tools"),
    ({"response_format": {"type": "json_object"}}, "field-response_format"),
    ({"seed": 3}, "field-seed"),
    ({"top_p": 0.5}, "field-top_p"),
    ({"model": "another"}, "model"),
    ({"messages": [{"role": "assistant", "content": "Hi"}]}, "turns"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
     "turns"),
    ({"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "s"},
                   {"role": "user", "content": "b"}]}, "turns"),
    ({"messages": [{"role": "user", "content": "  "}]}, "empty-question"),
    ({"messages": [{"role": "user", "content": None}]}, "content"),
    ({"messages": [{"role": "tool", "content": "42", "tool_call_id": "x"}]}, "tools"),
    ({"messages": [{"role": "assistant", "content": "", "tool_calls": [{"id": "x"}]},
                   {"role": "user", "content": "b"}]}, "tools"),
])
def test_what_the_cache_must_not_answer(fields: dict[str, Any], reason: str) -> None:
    assert decide(**fields) == Bypass(reason)


def test_a_shorter_max_tokens_is_a_budget_not_a_bypass() -> None:
    """Fewer answer tokens than the cache's answers are asked with (512 here) is a budget
    the cached answer must fit; as many or more, or none, asks for nothing less."""
    assert isinstance(decide(max_completion_tokens=100), Question)
    assert answer_budget(request(max_completion_tokens=100), 512) == 100
    assert answer_budget(request(max_tokens=511), 512) == 511
    assert answer_budget(request(max_tokens=512), 512) is None
    assert answer_budget(request(max_tokens=4096), 512) is None
    assert answer_budget(request(), 512) is None


def test_temperature_goes_upstream_only_when_configured() -> None:
    assert isinstance(decide(temperature=0.7), Question)
    assert decide(greedy_only=True, temperature=0.7) == Bypass("temperature")
    assert isinstance(decide(greedy_only=True, temperature=0), Question)


def test_what_the_cache_may_answer_and_how_it_is_split() -> None:
    found = decide(top_p=1, user="me", stream=True, n=1, max_tokens=4096, messages=[
        {"role": "system", "content": "Be brief."},
        {"role": "developer", "content": [{"type": "text", "text": "Be kind."}]},
        {"role": "user", "content": "First?"},
        {"role": "assistant", "content": "One.", "refusal": None, "tool_calls": None},
        {"role": "user", "content": [{"type": "text", "text": "Second"},
                                     {"type": "text", "text": "?"}]}])
    assert found == Question((("system", "Be brief."), ("developer", "Be kind.")),
                             (("First?", "One."),), "Second?")


@pytest.fixture(scope="module")
def base_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The proxy in front of a real upstream whose answers default to ANSWER_TOKENS
    tokens (a fuzzed request that names no max_tokens stays short)."""
    short = ServerSettings(defaults=replace(SERVER_DEFAULTS, max_tokens=ANSWER_TOKENS))
    with running_upstream(settings=short) as upstream:
        proxy = Proxy.open(proxy_settings(tmp_path_factory.mktemp("fuzz"), upstream))
        try:
            yield proxy.start()
        finally:
            proxy.close()


def post(base_url: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{base_url}/chat/completions", content=body, timeout=120,
                      headers={"Content-Type": "application/json",
                               "Authorization": "Bearer fuzz"})


def answered_in_full(response: httpx.Response) -> None:
    """A 200 with an answer: a whole completion, or an event stream that ends in [DONE]."""
    assert response.status_code == 200, response.text[:500]
    if response.headers["content-type"].startswith("text/event-stream"):
        events = [line for line in response.text.splitlines() if line.startswith("data: ")]
        assert events[-1] == "data: [DONE]", response.text[-300:]
        for event in events[:-1]:
            assert "error" not in json.loads(event[6:]), event
    else:
        assert isinstance(response.json()["choices"][0]["message"]["content"], str)


@fuzzed(max_examples=30)
@given(body=chat_requests(MODEL, ANSWER_TOKENS))
def test_every_valid_request_gets_its_answer(base_url: str, body: dict[str, Any]) -> None:
    answered_in_full(post(base_url, json.dumps(body).encode()))


@fuzzed()
@given(body=chat_bodies(MODEL))
def test_an_invalid_body_gets_a_4xx_naming_the_problem(base_url: str, body: bytes) -> None:
    """What the proxy's own model refuses gets 400 (or 413/415/422) with an OpenAI error
    that says what was wrong; what it accepts is answered, or refused by the upstream
    (its 400, relayed as ``upstream_refused``); never a 5xx."""
    response = post(base_url, body)
    try:
        ChatRequest.model_validate_json(body)
    except ValidationError:
        assert response.status_code in (400, 413, 415, 422), response.text[:500]
        openai_error(response)
        return
    if response.status_code == 200:
        answered_in_full(response)
    else:
        assert response.status_code == 400, response.text[:500]
        assert openai_error(response)["code"] == "upstream_refused"


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_command_serves_an_unmodified_openai_client(tmp_path: Path, upstream_url: str,
                                                        device_encoder_dir: Path,
                                                        stop: signal.Signals) -> None:
    """`meancache proxy` as a user runs it (a process, a port), and a plain SDK client;
    a service manager's stop (SIGTERM) or Ctrl+C (SIGINT) closes its caches and exits."""
    import subprocess
    import sys

    import openai

    from tests.support.paths import data_dir_linking
    from tests.support.servers import free_port, wait_for_port

    port = free_port()
    data = data_dir_linking(tmp_path / "data", device_encoder_dir)  # the default int8 encoder
    env = {"MEANCACHE_DATA_DIR": str(data), "PATH": "/usr/bin:/bin",
           "MEANCACHE_CONFIG_DIR": str(tmp_path / "config"), "HF_HUB_OFFLINE": "1",
           "MEANCACHE_ENCODER_MODEL": "minilm",
           "MEANCACHE_ANSWER_MAX_TOKENS": str(ANSWER_TOKENS),
           # a test of a hit must not draw: with an upstream named the cache learns, and
           # its first would-be hits are explored (the warm-up)
           "MEANCACHE_EXPLORE_RATE": "0"}
    process = subprocess.Popen([sys.executable, "-m", "meancache", "proxy", "--port",
                                str(port), "--upstream", upstream_url], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        wait_for_port(port, 120)
        app = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="script")
        raws = [app.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": question}])
            for question in ("What is the boiling point of water?",
                             "What's the boiling point of water?")]
        assert [raw.headers["x-meancache"].split(";")[0] for raw in raws] == ["miss", "hit"]
        answers = [raw.parse().choices[0].message.content for raw in raws]
        assert answers[1] == answers[0]  # the paraphrase got the cached answer
    finally:
        process.send_signal(stop)
        _, err = process.communicate(timeout=30)
    assert b"Traceback" not in err, err.decode()
    assert f"http://127.0.0.1:{port}/v1".encode() in err
    assert process.returncode == 128 + stop  # exited, its `finally`s run: not killed
    log = (tmp_path / "data" / "logs" / "meancache.log").read_text()
    assert "closed 1 proxy caches" in log


@pytest.mark.parametrize(("upstream", "host", "port", "refused"), [
    ("http://127.0.0.1:8788/v1", "127.0.0.1", 8788, True),
    ("http://localhost:8788", "127.0.0.1", 8788, True),
    ("127.0.0.1:8788", "0.0.0.0", 8788, True),
    ("http://127.0.0.1:8789/v1", "127.0.0.1", 8788, False),  # another port: another server
    ("https://api.example.com/v1", "127.0.0.1", 443, False),
    (None, "127.0.0.1", 8788, False),  # the embedded upstream
])
def test_an_upstream_at_the_proxys_own_address_is_refused(
    upstream: str | None, host: str, port: int, refused: bool
) -> None:
    assert (own_address_problem(upstream, host, port) is not None) == refused


def test_the_command_refuses_to_relay_to_itself_before_loading_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The apps' OPENAI_BASE_URL, set in the same shell, would make the proxy its own
    upstream: refused in one line, before the encoder loads."""
    monkeypatch.setenv("MEANCACHE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:8788/v1")
    assert main(["proxy", "--port", "8788"]) == 2
    err = capsys.readouterr().err
    assert "this proxy's own address" in err.replace("\n", " ")
    assert "Traceback" not in err
    assert not (tmp_path / "data" / "models").exists()  # nothing was assembled
