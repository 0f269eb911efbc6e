"""What one hostile caller of the upstream server still costs the others (issue 26, items 2
to 4), against the real server on loopback: a schema that would keep the model thread busy
for a minute, a greedy key's queue, long names, big and many headers, slow clients."""

import asyncio
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
import torch
from meancache.shared.loopback_server import LoopbackServer
from meancache.shared.pml import PML_MEDIA_TYPE
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.prompt_cache.module_store import ModuleStore
from meancache.upstream.prompt_cache.states import SegmentStates
from meancache.upstream.server.app import ServerSettings, create_app
from meancache.upstream.server.tenants import tenant_id
from meancache.upstream.server.worker import ModelWorker

from tests.support.servers import closes_trickled_headers

GREEDY, OTHER = "key-of-greedy", "key-of-other"
PML = {"Content-Type": PML_MEDIA_TYPE}


@pytest.fixture(scope="module")
def engine() -> PromptCacheEngine:
    return PromptCacheEngine(load_model("builtin:tiny"), 64 << 20)


class Served:
    """The real app for ``engine`` on a loopback uvicorn, with its model thread."""

    def __init__(self, engine: PromptCacheEngine, settings: ServerSettings,
                 **server: Any) -> None:
        self.app = create_app(engine, settings)
        self.worker: ModelWorker = self.app.state.worker
        self.server = LoopbackServer(self.app, "upstream", **server)

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.server.url, headers=headers, timeout=60)


@pytest.fixture
def served(engine: PromptCacheEngine) -> Iterator[Served]:
    running = Served(engine, ServerSettings(api_key=GREEDY, api_keys=(OTHER,)),
                     header_seconds=1.0)
    assert running.server.start()
    yield running
    running.server.stop()


class Gate:
    """Holds the model thread with a job of its own until ``release``."""

    def __init__(self, worker: ModelWorker) -> None:
        self.open, self.started = threading.Event(), threading.Event()

        def hold() -> None:
            self.started.set()
            self.open.wait(60)

        self.thread = threading.Thread(target=asyncio.run, args=(worker.call(hold, "gate"),))
        self.thread.start()
        assert self.started.wait(60)

    def release(self) -> None:
        self.open.set()
        self.thread.join(30)


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def schema(name: str, modules: int = 1) -> str:
    return (f'<schema name="{name}">'
            + "".join(f'<module name="m{i}">Text {i}.</module>' for i in range(modules))
            + "</schema>")


# --- item 2: one key cannot stall the others --------------------------------------------

def test_a_union_of_4000_modules_is_refused_before_any_encoding(served: Served) -> None:
    members = "".join(f'<module name="m{i}">x</module>' for i in range(4000))
    source = f'<schema name="bomb"><union>{members}</union></schema>'
    encodings = served.app.state.engine.modules.encodings
    with served.client(GREEDY) as greedy:
        start = time.perf_counter()
        refused = greedy.post("/v1/schemas", content=source, headers=PML)
        seconds = time.perf_counter() - start
    assert refused.status_code == 400, refused.text
    assert "holds at most 32 modules" in refused.json()["error"]["message"]
    assert served.app.state.engine.modules.encodings == encodings  # nothing was encoded
    assert seconds < 20  # today: 46 to 89 s of model time; refused in well under 1 s
    print(f"4,000-module union refused in {seconds * 1000:.0f} ms")


@pytest.mark.parametrize(("source", "limit"), [
    (schema("wide", 65), "at most 64 modules"),
    ('<schema name="deep">' + '<module name="d1"><module name="d2"><module name="d3">'
     '<module name="d4"><module name="d5">x</module></module></module></module></module>'
     "</schema>", "nested more than 4 deep"),
])
def test_schema_shape_is_capped_with_a_clear_error(served: Served, source: str,
                                                   limit: str) -> None:
    with served.client(GREEDY) as greedy:
        refused = greedy.post("/v1/schemas", content=source, headers=PML)
    assert refused.status_code == 400 and limit in refused.json()["error"]["message"]


def test_another_key_is_served_before_a_greedy_keys_queue(engine: PromptCacheEngine) -> None:
    """Six schema uploads of the greedy key wait; the other key's one, sent after them,
    runs second: after one of the greedy key's, not after all six."""
    running = Served(engine, ServerSettings(api_key=GREEDY, api_keys=(OTHER,)))
    order: list[str] = []
    add_schema = engine.add_schema

    def recorded(source: str, tenant: str, *args: Any) -> Any:
        order.append(tenant)
        return add_schema(source, tenant, *args)

    engine.add_schema = recorded  # type: ignore[method-assign]
    assert running.server.start()
    try:
        gate = Gate(running.worker)
        answers: list[int] = []

        def upload(key: str, name: str) -> None:
            with running.client(key) as client:
                answers.append(client.post("/v1/schemas", content=schema(name),
                                           headers=PML).status_code)

        threads = [threading.Thread(target=upload, args=(GREEDY, f"g{i}")) for i in range(6)]
        for thread in threads:
            thread.start()
        wait_until(lambda: running.worker.queued_for(tenant_id(GREEDY)) == 6, "greedy queued")
        threads.append(threading.Thread(target=upload, args=(OTHER, "o")))
        threads[-1].start()
        wait_until(lambda: running.worker.queued_for(tenant_id(OTHER)) == 1, "other queued")
        gate.release()
        for thread in threads:
            thread.join(60)
        assert answers == [201] * 7
        assert order == [tenant_id(GREEDY), tenant_id(OTHER)] + [tenant_id(GREEDY)] * 5
    finally:
        del engine.add_schema
        running.server.stop()


def test_a_greedy_key_is_refused_at_its_own_cap_while_others_are_queued(
    served: Served
) -> None:
    def send(key: str, name: str) -> None:
        with served.client(key) as client:
            client.post("/v1/schemas", content=schema(name), headers=PML)

    gate = Gate(served.worker)
    cap = served.worker.max_queued_per_key
    threads = [threading.Thread(target=send, args=(GREEDY, f"q{i}")) for i in range(cap)]
    threads.append(threading.Thread(target=send, args=(OTHER, "other-key")))
    try:
        for thread in threads[:-1]:
            thread.start()
        wait_until(lambda: served.worker.queued_for(tenant_id(GREEDY)) == cap, "queued")
        with served.client(GREEDY) as greedy:
            busy = greedy.post("/v1/schemas", content=schema("one-more"), headers=PML)
        assert busy.status_code == 429 and "this API key has" in busy.text
        threads[-1].start()  # another key is still queued, not refused
        wait_until(lambda: served.worker.queued_for(tenant_id(OTHER)) == 1, "other queued")
    finally:
        gate.release()
        for thread in threads:
            if thread.is_alive():
                thread.join(60)


class CountedStates(SegmentStates):
    """SegmentStates that count how often their size is read."""

    reads = 0

    @property
    def nbytes(self) -> int:
        CountedStates.reads += 1
        return super().nbytes


def test_the_module_store_keeps_its_byte_count_as_it_goes() -> None:
    """Inserting N states reads each one's size a bounded number of times (today every
    insert re-sums all the states held: N^2/2 reads)."""
    store = ModuleStore(budget_bytes=1 << 30)
    tensor = torch.zeros(1, 1, 1, 2)
    for i in range(500):
        store.get(("s", f"m{i}"), lambda: CountedStates((tensor,), (tensor,), torch.arange(1)))
    assert CountedStates.reads <= 2 * 500
    assert store.nbytes == 500 * 2 * tensor.numel() * tensor.element_size()
    store.drop_schema("s")
    assert store.nbytes == 0 and store.tokens == 0


# --- item 3: identifiers are capped and never echoed whole -------------------------------

def test_a_long_schema_name_is_refused_and_not_echoed(served: Served) -> None:
    name = "s" * (1 << 20)
    with served.client(GREEDY) as greedy:
        refused = greedy.post("/v1/schemas", json={"schema": f'<schema name="{name}"/>'})
        assert refused.status_code == 400 and len(refused.content) < 1000
        assert "at most 64 characters" in refused.json()["error"]["message"]
        used = greedy.post("/v1/chat/completions", json={"messages": [{
            "role": "user", "content": f'<prompt schema="{name}"><user>Hi</user></prompt>'}]})
        assert used.status_code == 400 and len(used.content) < 1000
        looked_up = greedy.get(f"/v1/schemas/{'n' * 8000}")
        assert looked_up.status_code == 404 and len(looked_up.content) < 1000


def test_errors_do_not_list_a_keys_schemas(served: Served) -> None:
    with served.client(GREEDY) as greedy:
        assert greedy.post("/v1/schemas", content=schema("private-name"),
                           headers=PML).status_code == 201
        missing = greedy.post("/v1/chat/completions", json={"messages": [{
            "role": "user", "content": '<prompt schema="other"><user>Hi</user></prompt>'}]})
    assert missing.status_code == 404 and "private-name" not in missing.text


@pytest.mark.parametrize("body", [
    {"model": "m" * 100_000, "messages": [{"role": "user", "content": "hi"}]},
    {"x" * 100_000: 1, "messages": [{"role": "user", "content": "hi"}]},
])
def test_long_model_ids_and_field_names_are_not_echoed(served: Served,
                                                       body: dict[str, Any]) -> None:
    with served.client(GREEDY) as greedy:
        refused = greedy.post("/v1/chat/completions", json=body)
    assert refused.status_code == 400 and len(refused.content) < 1000


def test_a_long_bearer_token_is_refused(served: Served) -> None:
    with served.client("k" * 4000) as long_key:
        assert long_key.get("/v1/models").status_code == 401


# --- item 4: headers, slow clients, big bodies --------------------------------------------

def raw(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        try:
            sock.sendall(data)
            return sock.recv(4096)
        except ConnectionResetError:
            return b"reset"


@pytest.mark.parametrize("size", [1 << 20, 16 << 20])
def test_a_big_header_is_refused_as_it_is_read(served: Served, size: int) -> None:
    answer = raw(served.server.port, b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Big: "
                 + b"a" * size + b"\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 431"), answer[:100]  # read to the end, then closed
    with served.client() as anyone:
        assert anyone.get("/health").status_code == 200


def test_too_many_headers_are_refused(served: Served) -> None:
    with served.client(GREEDY) as greedy:
        refused = greedy.get("/v1/models", headers={f"x-h{i}": "1" for i in range(200)})
    assert refused.status_code == 431
    assert refused.json()["error"]["code"] == "too_many_headers"


def test_a_slowloris_client_is_disconnected_when_a_key_is_set(served: Served) -> None:
    """Headers trickled in with an API key set (today never timed out): closed once the
    header deadline (1 s here) passes."""
    assert closes_trickled_headers(served.server.port,
                                   b"GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n", 30), \
        "the connection stayed open for 30 s of headers"


def test_a_body_that_never_arrives_is_answered_408(engine: PromptCacheEngine) -> None:
    from meancache.shared.http_limits import GuardRequests

    app = GuardRequests(create_app(engine, ServerSettings(api_key=GREEDY)), body_seconds=0.5)
    server = LoopbackServer(app, "upstream")
    assert server.start()
    try:
        answer = raw(server.port, b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Authorization: Bearer " + GREEDY.encode() + b"\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
        assert answer.startswith(b"HTTP/1.1 408"), answer[:100]
    finally:
        server.stop()


def test_an_unauthenticated_big_body_is_never_read(served: Served) -> None:
    answer = raw(served.server.port, b"POST /v1/chat/completions HTTP/1.1\r\n"
                 b"Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: 400000000\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 401"), answer[:100]


def test_an_answer_before_the_body_closes_the_connection(served: Served) -> None:
    """A 401 to a request announcing 400 MB: the connection is closed after the answer,
    so the server neither buffers nor reads and discards the rest (today it reads on)."""
    with socket.create_connection(("127.0.0.1", served.server.port), timeout=30) as sock:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 400000000\r\n\r\n")
        assert sock.recv(100).startswith(b"HTTP/1.1 401")
        sent = 0
        with pytest.raises(OSError):
            for sent in range(400):  # noqa: B007
                sock.sendall(b"a" * (1 << 20))
        assert sent < 64, f"the server read {sent} MiB of a body nobody authenticated"


def test_kept_alive_connections_still_serve_many_requests(served: Served) -> None:
    """Closing after an early answer does not close the connection of any other."""
    with served.client(GREEDY) as greedy:
        answers = [greedy.get("/v1/models"), greedy.get("/health"),
                   greedy.post("/v1/schemas", content=schema("kept"), headers=PML)]
    assert [a.status_code for a in answers] == [200, 200, 201]
    assert all(a.headers.get("connection") != "close" for a in answers)


# --- item 6: numbers at the edge of their range, a string for a flag ----------------------
@pytest.mark.parametrize("fields", [{"temperature": 1e-40}, {"temperature": 1e-300},
                                    {"top_p": 1e-46}, {"temperature": 0.5, "top_p": 1e-300}],
                         ids=["tiny-temperature", "tinier-temperature", "tiny-top-p",
                              "both"])
def test_extreme_sampling_values_answer_instead_of_failing(served: Served,
                                                           fields: dict[str, float]) -> None:
    with served.client(GREEDY) as http:
        for stream in (False, True):
            reply = http.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
                "stream": stream, **fields})
            assert reply.status_code == 200, reply.text
            if stream:
                assert reply.text.rstrip().endswith("data: [DONE]")  # the stream ended whole


def test_stream_must_be_a_boolean(served: Served) -> None:
    with served.client(GREEDY) as http:
        reply = http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "stream": "false"})
    assert reply.status_code == 400
    assert "'stream' must be true or false" in reply.json()["error"]["message"]
