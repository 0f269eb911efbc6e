"""What stands between the upstream and those who should not drive it: the embedded
server's per-run key and loopback-only names, the open-server warning, the request queue
limit, and engine state read only on the model thread or under its lock."""

import asyncio
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import torch
from meancache.shared.hosts import host_name, open_server_warning
from meancache.shared.processes import free_port
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.prompt_cache.module_store import ModuleStore
from meancache.upstream.prompt_cache.states import SegmentStates
from meancache.upstream.server.app import ServerSettings, create_app
from meancache.upstream.server.limits import Limits
from starlette.testclient import TestClient

from meancache.embedded import start_embedded_upstream

CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def test_the_embedded_server_answers_only_its_own_key_on_loopback_names(
        tmp_path: Path) -> None:
    first = start_embedded_upstream("builtin:tiny", tmp_path, None)
    second = start_embedded_upstream("builtin:tiny", tmp_path, None)
    try:
        assert first.url.startswith("http://127.0.0.1:")
        assert first.api_key and len(first.api_key) >= 32 and first.api_key != second.api_key
        key = {"Authorization": f"Bearer {first.api_key}"}
        assert httpx.get(f"{first.url}/v1/models").status_code == 401
        assert httpx.get(f"{second.url}/v1/models", headers=key).status_code == 401
        assert httpx.post(f"{first.url}/v1/chat/completions", json=CHAT, headers=key,
                          timeout=60).status_code == 200
        port = first.url.rsplit(":", 1)[1]
        for host in ("localhost", f"localhost:{port}", f"[::1]:{port}"):
            assert httpx.get(f"{first.url}/v1/models",
                             headers={**key, "Host": host}).status_code == 200
        rebound = httpx.get(f"{first.url}/v1/models",
                            headers={**key, "Host": f"attacker.example:{port}"})
        assert rebound.status_code == 400
        assert rebound.json()["error"]["code"] == "host_not_allowed"
        form = httpx.post(f"{first.url}/v1/chat/completions", content=b'{"messages": []}',
                          headers={**key, "Content-Type": "text/plain"})
        assert form.status_code == 415
    finally:
        first.stop()
        second.stop()


def test_serving_on_a_network_address_without_a_key_warns_on_start() -> None:
    command = [sys.executable, "-m", "meancache", "upstream", "serve", "--model",
               "builtin:tiny", "--host", "0.0.0.0", "--port", str(free_port())]
    warning = "warning: serving on 0.0.0.0 without an API key"
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stderr is not None
            # Read until the warning or the start line (a library may warn first); the
            # warning must come before the server says it serves.
            seen = []
            for line in process.stderr:
                seen.append(line)
                if warning in line or "meancache upstream: serving" in line:
                    break
        finally:
            process.terminate()
    assert seen and warning in seen[-1], seen


@pytest.mark.parametrize(("address", "keyed", "warned"), [
    ("0.0.0.0", False, True), ("192.168.1.5", False, True), ("upstream.example", False, True),
    ("0.0.0.0", True, False), ("127.0.0.1", False, False), ("::1", False, False),
    ("localhost", False, False),
])
def test_only_a_keyless_server_off_loopback_is_warned_about(address: str, keyed: bool,
                                                            warned: bool) -> None:
    assert (open_server_warning(address, keyed) is not None) == warned


@pytest.fixture(scope="module")
def engine() -> PromptCacheEngine:
    return PromptCacheEngine(load_model("builtin:tiny"), 64 << 20)


@pytest.fixture
def client(engine: PromptCacheEngine) -> Iterator[TestClient]:
    app = create_app(engine, ServerSettings(limits=Limits(max_queued=1)))
    with TestClient(app) as c:
        yield c


class HeldWorker:
    """Keeps the model thread busy until released, with ``queued`` more jobs waiting."""

    def __init__(self, client: TestClient, queued: int) -> None:
        self.gate, self.started = threading.Event(), threading.Event()
        worker = client.app.state.worker  # type: ignore[attr-defined]

        def hold() -> None:
            self.started.set()
            self.gate.wait(30)

        self.threads = [threading.Thread(target=asyncio.run, args=(worker.call(hold),))
                        for _ in range(queued + 1)]
        self.threads[0].start()
        assert self.started.wait(60)
        for thread in self.threads[1:]:
            thread.start()
        deadline = time.monotonic() + 60
        while worker.queued < queued:
            assert time.monotonic() < deadline, "the held requests never reached the queue"
            time.sleep(0.01)

    def release(self) -> None:
        self.gate.set()
        for thread in self.threads:
            thread.join(10)


def test_a_full_queue_is_answered_429_and_then_serves_again(client: TestClient) -> None:
    held = HeldWorker(client, queued=1)
    try:
        busy = client.post("/v1/chat/completions", json=CHAT)
        assert busy.status_code == 429
        assert busy.json()["error"]["code"] == "server_busy"
    finally:
        held.release()
    assert client.post("/v1/chat/completions", json=CHAT).status_code == 200


def test_schema_listing_waits_for_the_model_thread(client: TestClient) -> None:
    held = HeldWorker(client, queued=0)
    answers: list[int] = []
    listing = threading.Thread(target=lambda: answers.append(
        client.get("/v1/schemas").status_code))
    try:
        listing.start()
        listing.join(0.5)
        assert answers == []  # read on the model thread, which is busy
    finally:
        held.release()
    listing.join(10)
    assert answers == [200]


def states(tokens: int) -> SegmentStates:
    tensor = torch.zeros(1, 1, tokens, 2)
    return SegmentStates((tensor,), (tensor,), torch.arange(tokens))


def test_module_memory_can_be_read_while_the_model_thread_changes_it() -> None:
    store = ModuleStore(budget_bytes=1 << 20)
    stop = threading.Event()

    def churn() -> None:
        i = 0
        while not stop.is_set():
            store.get((f"s{i % 50}", "m"), lambda: states(4))
            store.drop_schema(f"s{(i + 25) % 50}")
            i += 1

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    thread = threading.Thread(target=churn)
    thread.start()
    try:
        for _ in range(20_000):
            assert store.nbytes >= 0 and store.tokens >= 0
    finally:
        stop.set()
        thread.join()
        sys.setswitchinterval(switch)


@pytest.mark.parametrize("header", [
    "localhost:abc", "localhost:80:90", "localhost:99999", "[::1", "[::1]x", "[zz::1]:80",
    "local host", "user@localhost", "localhost/x", "", "-localhost",
])
def test_a_malformed_host_header_is_refused(header: str) -> None:
    """Host names are parsed strictly: nothing that merely starts like a loopback name."""
    assert host_name(header) is None
    app = create_app(PromptCacheEngine(load_model("builtin:tiny")),
                     ServerSettings(allowed_hosts=frozenset({"localhost", "[::1]"})))
    with TestClient(app, base_url="http://localhost") as client:
        refused = client.get("/v1/models", headers={"Host": header})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == "host_not_allowed"
        assert client.get("/v1/models", headers={"Host": "localhost:8080"}).status_code == 200


def test_allow_host_adds_names_to_the_loopback_ones() -> None:
    from meancache.upstream.serve_commands import allowed_hosts, host_argument

    assert allowed_hosts(None) is None
    assert allowed_hosts([host_argument("Upstream.Example")]) == {
        "localhost", "127.0.0.1", "[::1]", "upstream.example"}
    for bad in ("upstream.example:8080", "up stream", "[::1"):
        with pytest.raises(Exception, match="a host name without a port"):
            host_argument(bad)
