"""The Fleet gateway against path escapes, big bodies and slow clients (issue 26, items 1
and 4), with a real SuperLink behind it on loopback: a path that is not exactly one of the
Fleet methods a SuperNode calls is refused before anything reaches the SuperLink."""

import http.client
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from meancache.fl_server.fleet_gateway import FLEET_METHODS, MAX_BODY_BYTES, create_gateway
from meancache.fl_server.processes import superlink_command
from meancache.shared.loopback_server import LoopbackServer
from meancache.shared.processes import flower_environment, free_port

from tests.support.servers import closes_trickled_headers, wait_for_port

PROTOBUF = {"Content-Type": "application/protobuf"}
ESCAPES = [
    "/v1/fleet/../control/list-runs",
    "/v1/fleet/%2e%2e/control/list-runs",
    "/v1/fleet/%2E%2E/control/list-runs",
    "/v1/fleet/..%2fcontrol/list-runs",
    "/v1/fleet/..%2Fcontrol%2Flist-runs",
    "/v1/fleet/./../control/list-runs",
    "/v1/fleet/.%2e/control/start-run",
    "/v1/fleet//../control/list-runs",
    "//v1/fleet/get-run",
    "/v1/fleet/get-run/",
    "/v1/fleet/get-run?x=1",
    "/v1/fleet/%67et-run",
    "/v1/fleet/",
    "/v1/control/list-runs",
]


def post(port: int, path: str, body: bytes = b"", headers: dict[str, str] | None = None
         ) -> tuple[int, bytes]:
    """POST with the path sent byte for byte (httpx would resolve dot segments first)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request("POST", path, body=body, headers={**PROTOBUF, **(headers or {})})
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


@dataclass(frozen=True)
class SuperLink:
    port: int
    log: Path  # its output, with one access line per request it answered

    def requests(self, path: str) -> int:
        """How many requests for ``path`` the SuperLink has logged so far."""
        return self.log.read_text(errors="replace").count(f'"POST {path} HTTP/1.1"')

    def wait_for_requests(self, path: str, count: int, seconds: float = 10) -> int:
        """The logged count for ``path`` once it reaches ``count`` (or the deadline)."""
        deadline = time.monotonic() + seconds
        while (seen := self.requests(path)) < count and time.monotonic() < deadline:
            time.sleep(0.05)
        return seen


@pytest.fixture(scope="module")
def superlink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SuperLink]:
    """A real SuperLink on loopback (its control and Fleet port), logging to a file."""
    state = tmp_path_factory.mktemp("superlink")
    port = free_port()
    process = subprocess.Popen(superlink_command(state, "127.0.0.1", port, None),
                               env=flower_environment(FLWR_HOME=str(state / "home")),
                               stdout=(state / "log").open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        yield SuperLink(port, state / "log")
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def gateway(superlink: SuperLink, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    server = LoopbackServer(create_gateway(f"127.0.0.1:{superlink.port}", None,
                                           tmp_path_factory.mktemp("signatures")), "gateway",
                            header_seconds=1.0)
    assert server.start()
    yield server.port
    server.stop()


def test_the_superlink_answers_run_listing_to_whoever_reaches_it(superlink: SuperLink) -> None:
    """The premise: behind the gateway, the Control API answers anyone."""
    assert post(superlink.port, "/v1/control/list-runs")[0] == 200


@pytest.mark.parametrize("path", ESCAPES)
def test_no_path_walks_out_of_the_fleet_api(gateway: int, path: str) -> None:
    status, body = post(gateway, path)
    assert status == 403, (status, body[:200])
    assert b"only the Fleet API" in body


def test_each_fleet_method_a_supernode_calls_is_forwarded(gateway: int,
                                                          superlink: SuperLink) -> None:
    """An empty request carries no node authentication: the SuperLink itself refuses it
    with 401, and the gateway relays that answer (the SuperLink logs the call)."""
    for path in FLEET_METHODS.values():
        before = superlink.requests(path)
        assert post(gateway, path) == post(superlink.port, path) == (
            401, b'{"detail":"Invalid SuperNode authentication"}'), path
        assert superlink.wait_for_requests(path, before + 2) == before + 2, path


def test_only_post_reaches_the_fleet_api(gateway: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", gateway, timeout=30)
    connection.request("GET", "/v1/fleet/get-run")
    assert connection.getresponse().status == 403
    connection.close()


def test_a_big_body_is_refused_before_it_is_read(gateway: int, superlink: SuperLink) -> None:
    """Declared over the cap: 413 without the body being sent at all."""
    path = "/v1/fleet/push-object"
    before = superlink.requests(path)
    with socket.create_connection(("127.0.0.1", gateway), timeout=30) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/protobuf\r\n"
                     b"Content-Length: %d\r\n\r\n" % (path.encode(), 400 * 1024 * 1024))
        assert sock.recv(200).startswith(b"HTTP/1.1 413")
    assert superlink.requests(path) == before  # nothing was forwarded


def test_a_chunked_body_is_cut_off_at_the_cap(gateway: int, superlink: SuperLink) -> None:
    """A chunked body one byte over the cap, whose end never comes: the gateway answers
    413 as soon as the cap is passed (it does not wait for the rest), and the SuperLink
    never sees the request. Exactly cap + 1 bytes are sent, all of which the gateway
    reads, so its close is an orderly one and the answer cannot be lost to a reset."""
    path = "/v1/fleet/push-object"
    before = superlink.requests(path)
    piece = 1 << 20
    with socket.create_connection(("127.0.0.1", gateway), timeout=30) as sock:
        sock.sendall(b"POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/protobuf"
                     b"\r\nTransfer-Encoding: chunked\r\n\r\n" % path.encode())
        for _ in range(MAX_BODY_BYTES // piece):
            sock.sendall(b"%x\r\n%s\r\n" % (piece, b"\0" * piece))
        sock.sendall(b"1\r\n\0\r\n")  # the byte over the cap; no terminating chunk
        assert sock.recv(200).startswith(b"HTTP/1.1 413")
    assert superlink.requests(path) == before


def test_a_slow_client_is_disconnected(gateway: int) -> None:
    """Headers trickled byte by byte (slowloris): the gateway closes the connection once
    its header deadline (1 s here) passes, instead of holding the socket forever."""
    assert closes_trickled_headers(gateway, b"POST /v1/fleet/get-run HTTP/1.1\r\nHost: x\r\n",
                                   15), "the connection stayed open for 15 s of headers"


def test_a_big_header_is_refused_unread(gateway: int, superlink: SuperLink) -> None:
    """A 1 MiB header: refused with 431 once the first 16 KiB are read (the rest is read
    and dropped before the connection closes), never parsed whole or forwarded."""
    path = "/v1/fleet/get-run"
    before = superlink.requests(path)
    status, _ = post(gateway, path, headers={"X-Big": "a" * (1 << 20)})
    assert status == 431
    assert superlink.requests(path) == before  # never forwarded
    assert post(gateway, path)[0] == 401  # and the gateway serves on: the SuperLink answers


def test_a_superlink_that_never_answers_times_out() -> None:
    """A stalled SuperLink (it accepts and says nothing): the gateway answers 502 once its
    upstream timeout passes, instead of holding the SuperNode's request forever."""
    with socket.socket() as stalled:
        stalled.bind(("127.0.0.1", 0))
        stalled.listen()
        port = stalled.getsockname()[1]
        server = LoopbackServer(create_gateway(f"127.0.0.1:{port}", None, Path("none"),
                                               timeout=httpx.Timeout(0.5)), "gateway")
        assert server.start()
        try:
            assert post(server.port, "/v1/fleet/get-run")[0] == 502
        finally:
            server.stop()
