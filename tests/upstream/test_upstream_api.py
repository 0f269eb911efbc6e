"""The upstream HTTP API end to end on loopback with the built-in model."""

import json
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from meancache.shared.pml import PML_MEDIA_TYPE
from meancache.upstream.server.app import ServerSettings

from tests.support.servers import free_port, running_upstream

KEY = "test-key"
SCHEMA = """<schema name="manual">
  <system>You answer questions about the manual.</system>
  <module name="chapter">The manual explains how to assemble a bicycle, step by step:
    frame, wheels, chain, brakes and saddle, with a list of tools.</module>
  <module name="appendix">Appendix with torque values.</module>
</schema>"""
AS_PML = {"Content-Type": PML_MEDIA_TYPE}
PML = '<prompt schema="manual"><chapter/><user>Which tools?</user></prompt>'


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with running_upstream(settings=ServerSettings(api_key=KEY, max_body_bytes=64 * 1024)) as url:
        yield url


@pytest.fixture
def client(base_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {KEY}"},
                      timeout=60) as c:
        yield c


def chat(client: httpx.Client, content: str, **extra: object) -> httpx.Response:
    body = {"model": "builtin:tiny", "messages": [{"role": "user", "content": content}],
            "max_tokens": 8, "temperature": 0, **extra}
    return client.post("/v1/chat/completions", json=body)


def stream_events(client: httpx.Client, content: str, **extra: object) -> list[dict]:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 8,
            "temperature": 0, "stream": True, **extra}
    events = []
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        for line in response.iter_lines():
            if line.startswith("data: "):
                payload = line.removeprefix("data: ")
                events.append({"done": True} if payload == "[DONE]" else json.loads(payload))
    return events


def test_health_needs_no_key_and_models_says_untrained(base_url: str,
                                                       client: httpx.Client) -> None:
    assert httpx.get(f"{base_url}/health").json()["status"] == "ok"
    model = client.get("/v1/models").json()["data"][0]
    assert model["id"] == "builtin:tiny"
    assert model["meancache"]["untrained"] is True
    assert model["meancache"]["precision"] == "float32"  # the test servers' own choice


def test_auth_is_required_and_checked(base_url: str) -> None:
    assert httpx.get(f"{base_url}/v1/models").status_code == 401
    wrong = httpx.get(f"{base_url}/v1/models", headers={"Authorization": "Bearer nope"})
    assert wrong.status_code == 401
    assert wrong.json()["error"]["code"] == "invalid_api_key"


def test_schema_lifecycle(client: httpx.Client) -> None:
    created = client.post("/v1/schemas", headers=AS_PML, content=SCHEMA)
    assert created.status_code == 201
    info = created.json()
    assert info["id"] == "manual"
    assert set(info["modules"]) == {"chapter", "appendix"}
    assert info["cached_tokens"] > 0 and info["nbytes"] > 0
    assert "manual" in [s["id"] for s in client.get("/v1/schemas").json()["data"]]
    assert client.get("/v1/schemas/manual").json()["cached_tokens"] == info["cached_tokens"]
    as_json = client.post("/v1/schemas", json={"schema": SCHEMA.replace("manual", "copy")})
    assert as_json.status_code == 201
    assert client.delete("/v1/schemas/copy").json()["deleted"] is True
    assert client.get("/v1/schemas/copy").status_code == 404


def test_completion_reports_reused_module_tokens(client: httpx.Client) -> None:
    client.post("/v1/schemas", headers=AS_PML, content=SCHEMA)
    plain = chat(client, "Which tools?").json()
    assert plain["object"] == "chat.completion"
    assert plain["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    reused = chat(client, PML).json()
    usage = reused["usage"]
    cached = usage["prompt_tokens_details"]["cached_tokens"]
    assert 0 < cached < usage["prompt_tokens"]
    assert usage["completion_tokens"] == 8
    assert usage["total_tokens"] == usage["prompt_tokens"] + 8
    assert reused["choices"][0]["finish_reason"] == "length"
    with_appendix = chat(client, PML.replace("<chapter/>", "<chapter/><appendix/>")).json()
    assert with_appendix["usage"]["prompt_tokens_details"]["cached_tokens"] > cached


def test_streaming_matches_the_whole_response(client: httpx.Client) -> None:
    client.post("/v1/schemas", headers=AS_PML, content=SCHEMA)
    whole = chat(client, PML).json()
    events = stream_events(client, PML, stream_options={"include_usage": True})
    assert events[0]["choices"][0]["delta"]["role"] == "assistant"
    assert events[-1] == {"done": True}
    text = "".join(e["choices"][0]["delta"].get("content", "")
                   for e in events if e.get("choices"))
    assert text == whole["choices"][0]["message"]["content"]
    usage = [e for e in events if e.get("usage")]
    assert usage[0]["usage"] == whole["usage"]
    assert any(e.get("choices") and e["choices"][0]["finish_reason"] == "length"
               for e in events)


@pytest.mark.parametrize(
    ("request_kwargs", "status", "fragment"),
    [
        ({"content": b"{not json", "headers": {"Content-Type": "application/json"}}, 400,
         "not valid JSON"),
        ({"json": {"messages": []}}, 400, "'messages' must be a non-empty list"),
        ({"json": {"messages": [{"role": "robot", "content": "x"}]}}, 400, "'role'"),
        ({"json": {"messages": [{"role": "user", "content": "x"}], "temperature": "hot"}},
         400, "'temperature' must be a number"),
        ({"json": {"messages": [{"role": "user", "content": "x"}], "max_tokens": 10**6}},
         400, "answers with at most 4096 tokens"),
        ({"json": {"messages": [{"role": "user", "content": "x" * 70_000}]}}, 413, "bytes"),
    ],
)
def test_bad_requests_get_a_clear_4xx(client: httpx.Client, request_kwargs: dict,
                                      status: int, fragment: str) -> None:
    response = client.post("/v1/chat/completions", **request_kwargs)
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]


@pytest.mark.parametrize(
    ("content", "status", "fragment"),
    [
        ('<prompt schema="nope"><chapter/></prompt>', 404, "unknown schema 'nope'"),
        ('<prompt schema="manual"><chapter/><chapter/></prompt>', 400, "imported twice"),
        ('<prompt schema="manual"><index/></prompt>', 400, "unknown module 'index'"),
        ('<prompt schema="manual"><chapter>', 400, "line 1"),
    ],
)
def test_bad_pml_names_what_is_wrong(client: httpx.Client, content: str, status: int,
                                     fragment: str) -> None:
    client.post("/v1/schemas", headers=AS_PML, content=SCHEMA)
    response = chat(client, content)
    assert response.status_code == status
    assert fragment in response.json()["error"]["message"]


def test_bad_schema_is_rejected_with_its_position(client: httpx.Client) -> None:
    response = client.post("/v1/schemas", headers=AS_PML,
                           content='<schema name="x">\n  <param len="3"/></schema>')
    assert response.status_code == 400
    assert response.json()["error"]["message"].startswith("line 2, column 3")


def test_concurrent_requests_are_queued_not_interleaved(client: httpx.Client) -> None:
    client.post("/v1/schemas", headers=AS_PML, content=SCHEMA)
    prompts = [PML, "Tell me about wheels.", PML.replace("<chapter/>", "<appendix/>")]
    alone = [chat(client, p, max_tokens=16).json()["choices"][0]["message"]["content"]
             for p in prompts]
    together: list[str | None] = [None] * len(prompts)

    def ask(i: int) -> None:
        together[i] = chat(client, prompts[i], max_tokens=16).json()[
            "choices"][0]["message"]["content"]

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(prompts))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert together == alone


def metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no metric {name}")


def test_a_client_leaving_mid_stream_frees_the_model(client: httpx.Client) -> None:
    cancelled = metric(client, "meancache_upstream_cancelled_total")
    # Greedy and unguarded: the stream makes the tokens this unstreamed answer made, which
    # reach the token cap (checked here, on this machine): it cannot end on its own before
    # the client leaves, only by being cancelled.
    body = {"messages": [{"role": "user", "content": "write a lot"}], "max_tokens": 300,
            "temperature": 0, "repetition_penalty": 1, "dry_multiplier": 0,
            "stop_on_loops": False}
    whole = client.post("/v1/chat/completions", json=body).json()
    assert whole["choices"][0]["finish_reason"] == "length", whole
    with client.stream("POST", "/v1/chat/completions", json={**body, "stream": True}
                       ) as response:
        for line in response.iter_lines():
            if '"content": "' in line and '"role"' not in line:
                break  # one token arrived; leave
    deadline = time.monotonic() + 60
    while metric(client, "meancache_upstream_cancelled_total") <= cancelled:
        assert time.monotonic() < deadline, "the abandoned completion was never stopped"
        time.sleep(0.05)
    assert chat(client, "next").status_code == 200


def test_metrics_report_ttft_cached_tokens_and_module_memory(client: httpx.Client) -> None:
    client.post("/v1/schemas", headers=AS_PML, content=SCHEMA)
    before = metric(client, "meancache_upstream_cached_tokens_total")
    chat(client, PML)
    assert metric(client, "meancache_upstream_cached_tokens_total") > before
    assert metric(client, "meancache_upstream_time_to_first_token_seconds_count") >= 1
    assert metric(client, "meancache_upstream_module_memory_bytes") > 0
    assert metric(client, "meancache_upstream_requests_total") >= 1


def test_unknown_route_is_a_json_404(client: httpx.Client) -> None:
    response = client.get("/v2/nothing")
    assert response.status_code == 404
    assert "no route" in response.json()["error"]["message"]


def test_the_serve_command_starts_a_server(tmp_path: object) -> None:
    port = free_port()
    env = {"MEANCACHE_DATA_DIR": str(tmp_path), "MEANCACHE_CONFIG_DIR": str(tmp_path),
           "PATH": "/usr/bin:/bin"}
    process = subprocess.Popen(
        [sys.executable, "-m", "meancache", "upstream", "serve", "--model", "builtin:tiny",
         "--port", str(port)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, process.stderr.read() if process.stderr else ""
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        response = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert response.status_code == 200
    finally:
        process.terminate()
        _, err = process.communicate(timeout=20)
    assert "untrained random-init demo model" in err
