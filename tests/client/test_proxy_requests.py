"""What the proxy makes of a request: which ones the cache may answer (eligibility), and
that no body, however malformed, gets a 500 or a traceback (a property test against the
running proxy)."""

import json
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from meancache.client.proxy.eligibility import Bypass, Question, question_of
from meancache.client.proxy.service import Proxy, own_address_problem
from meancache.client.proxy.wire import ChatRequest

from meancache.cli import main
from tests.client.test_proxy import proxy_settings
from tests.support.servers import ECHO_MODEL, echo_upstream


def request(**fields: Any) -> ChatRequest:
    body = {"model": ECHO_MODEL, "messages": [{"role": "user", "content": "Why?"}]} | fields
    return ChatRequest.model_validate_json(json.dumps(body))


def decide(greedy_only: bool = False, **fields: Any) -> Question | Bypass:
    return question_of(request(**fields), ECHO_MODEL, 512, greedy_only)


@pytest.mark.parametrize(("fields", "reason"), [
    ({"functions": [{"name": "f"}]}, "tools"),
    ({"tool_choice": "auto"}, "tools"),
    ({"response_format": {"type": "json_object"}}, "field-response_format"),
    ({"seed": 3}, "field-seed"),
    ({"top_p": 0.5}, "field-top_p"),
    ({"model": "another"}, "model"),
    ({"max_completion_tokens": 100}, "max-tokens"),
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
    with echo_upstream() as upstream:
        proxy = Proxy.open(proxy_settings(tmp_path_factory.mktemp("fuzz"), upstream))
        try:
            yield proxy.start()
        finally:
            proxy.close()


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
FIELDS = ["model", "messages", "stream", "stream_options", "max_tokens", "temperature", "n",
          "tools", "stop", "top_p", "role", "content"]
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "assistant", "system", "tool", "x"]) | JSON,
    "content": st.text(max_size=30) | JSON})
BODIES = st.one_of(
    JSON.map(lambda value: json.dumps(value).encode()),
    st.binary(max_size=60),
    st.fixed_dictionaries({}, optional={
        **{name: JSON for name in FIELDS},
        "model": st.just(ECHO_MODEL) | JSON,
        "messages": st.lists(MESSAGE, max_size=3) | JSON}).map(
            lambda body: json.dumps(body).encode()),
)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(body=BODIES)
def test_no_body_gets_a_500(base_url: str, body: bytes) -> None:
    response = httpx.post(f"{base_url}/chat/completions", content=body, timeout=30,
                          headers={"Content-Type": "application/json"})
    if response.headers.get("content-type", "").startswith("text/event-stream"):
        assert response.status_code == 200 and "data: " in response.text
        return
    assert response.status_code != 500
    answer = response.json()
    if response.status_code >= 400:
        assert set(answer["error"]) == {"message", "type", "param", "code"}
        assert answer["error"]["message"] and "Traceback" not in answer["error"]["message"]
    else:
        assert answer["choices"][0]["message"]["content"] is not None


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_command_serves_an_unmodified_openai_client(tmp_path: Path,
                                                        stop: signal.Signals) -> None:
    """`meancache proxy` as a user runs it (a process, a port), and a plain SDK client;
    a service manager's stop (SIGTERM) or Ctrl+C (SIGINT) closes its caches and exits."""
    import subprocess
    import sys

    import openai

    from tests.support.servers import free_port, wait_for_port

    port = free_port()
    with echo_upstream() as upstream:
        env = {"MEANCACHE_DATA_DIR": str(tmp_path / "data"), "PATH": "/usr/bin:/bin",
               "MEANCACHE_CONFIG_DIR": str(tmp_path / "config"), "HF_HUB_OFFLINE": "1",
               "MEANCACHE_ENCODER_MODEL": "minilm", "MEANCACHE_ENCODER_BACKEND": "torch"}
        process = subprocess.Popen([sys.executable, "-m", "meancache", "proxy", "--port",
                                    str(port), "--upstream", upstream], env=env,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            wait_for_port(port, 120)
            app = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="script")
            answers = [app.chat.completions.create(
                model=ECHO_MODEL, messages=[{"role": "user", "content": question}])
                .choices[0].message.content
                for question in ("What is the boiling point of water?",
                                 "What's the boiling point of water?")]
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
