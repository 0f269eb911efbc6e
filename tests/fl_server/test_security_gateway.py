"""The Fleet gateway against path escapes, big bodies and slow clients (issue 26, items 1
and 4), with a real SuperLink behind it on loopback: a path that is not exactly one of the
Fleet methods a SuperNode calls is refused before anything reaches the SuperLink."""

import http.client
import socket
import subprocess
from collections.abc import Iterator
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


@pytest.fixture(scope="module")
def superlink(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real SuperLink on loopback; yields its (control) port."""
    state = tmp_path_factory.mktemp("superlink")
    port = free_port()
    process = subprocess.Popen(superlink_command(state, "127.0.0.1", port, None),
                               env=flower_environment(FLWR_HOME=str(state / "home")),
                               stdout=(state / "log").open("wb"), stderr=subprocess.STDOUT)
    try:
        wait_for_port(port)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)


@pytest.fixture(scope="module")
def gateway(superlink: int, tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    server = LoopbackServer(create_gateway(f"127.0.0.1:{superlink}", None,
                                           tmp_path_factory.mktemp("signatures")), "gateway",
                            header_seconds=1.0)
    assert server.start()
    yield server.port
    server.stop()


def test_the_superlink_answers_run_listing_to_whoever_reaches_it(superlink: int) -> None:
    """The premise: behind the gateway, the Control API answers anyone."""
    assert post(superlink, "/v1/control/list-runs")[0] == 200


@pytest.mark.parametrize("path", ESCAPES)
def test_no_path_walks_out_of_the_fleet_api(gateway: int, path: str) -> None:
    status, body = post(gateway, path)
    assert status == 403, (status, body[:200])
    assert b"only the Fleet API" in body


def test_each_fleet_method_a_supernode_calls_is_forwarded(gateway: int) -> None:
    for path in FLEET_METHODS.values():
        status, body = post(gateway, path)  # an empty request: the SuperLink itself answers
        assert status != 403, (path, body[:200])


def test_only_post_reaches_the_fleet_api(gateway: int) -> None:
    connection = http.client.HTTPConnection("127.0.0.1", gateway, timeout=30)
    connection.request("GET", "/v1/fleet/get-run")
    assert connection.getresponse().status == 403
    connection.close()


def test_a_big_body_is_refused_before_it_is_read(gateway: int) -> None:
    """Declared over the cap: 413 without the body being sent at all."""
    with socket.create_connection(("127.0.0.1", gateway), timeout=30) as sock:
        sock.sendall(b"POST /v1/fleet/push-object HTTP/1.1\r\nHost: x\r\n"
                     b"Content-Type: application/protobuf\r\n"
                     b"Content-Length: %d\r\n\r\n" % (400 * 1024 * 1024))
        assert sock.recv(200).startswith(b"HTTP/1.1 413")


def test_a_chunked_body_is_cut_off_at_the_cap(gateway: int) -> None:
    def chunks() -> Iterator[bytes]:
        for _ in range(MAX_BODY_BYTES // (1 << 20) + 2):
            yield b"\0" * (1 << 20)

    connection = http.client.HTTPConnection("127.0.0.1", gateway, timeout=30)
    try:
        connection.request("POST", "/v1/fleet/push-object", body=chunks(),
                           headers={**PROTOBUF, "Transfer-Encoding": "chunked"},
                           encode_chunked=True)
        assert connection.getresponse().status == 413
    except (BrokenPipeError, ConnectionResetError):
        # The gateway answered 413 and closed while the rest was still on its way: the
        # reset itself shows it stopped reading (a server that read the whole body and
        # then answered would have left nothing unread to reset on).
        pass
    finally:
        connection.close()


def test_a_slow_client_is_disconnected(gateway: int) -> None:
    """Headers trickled byte by byte (slowloris): the gateway closes the connection once
    its header deadline (1 s here) passes, instead of holding the socket forever."""
    assert closes_trickled_headers(gateway, b"POST /v1/fleet/get-run HTTP/1.1\r\nHost: x\r\n",
                                   15), "the connection stayed open for 15 s of headers"


def test_a_big_header_is_refused_unread(gateway: int) -> None:
    """A 1 MiB header: refused with 431 once the first 16 KiB are read (the rest is read
    and dropped before the connection closes), never parsed whole or forwarded."""
    status, _ = post(gateway, "/v1/fleet/get-run", headers={"X-Big": "a" * (1 << 20)})
    assert status == 431
    assert post(gateway, "/v1/fleet/get-run")[0] != 431  # and the gateway serves on


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
