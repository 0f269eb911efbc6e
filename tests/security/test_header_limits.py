"""The header limits of every server (shared/http_limits.py) hold on what was received,
however the client frames it (issue 38, finding 2: a 65,000-byte header sent in one
write passed the 16 KiB limit, because h11 only counted what was still incomplete
between reads). Each case goes to each real server on loopback, in one write and in
one-byte pieces: the proxy (over the real upstream), the upstream, the FL server's Fleet
gateway and its model endpoint."""

import socket
from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from meancache.client.config import load_settings
from meancache.client.proxy.service import Proxy
from meancache.fl_server.fleet_gateway import create_gateway
from meancache.fl_server.model_endpoint import create_model_app
from meancache.shared.loopback_server import LoopbackServer

from tests.support.servers import free_port, running_upstream

MAX_HEADER_BYTES = 16 * 1024  # the request line and headers, as docs/security.md states
MAX_REQUEST_LINE_BYTES = 8 * 1024


@dataclass(frozen=True)
class Target:
    port: int
    path: str  # a GET the server answers without any header beyond Host


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_upstream() as url:
        yield url


@pytest.fixture(scope="module")
def proxy(upstream: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    data = tmp_path_factory.mktemp("proxy")
    settings = load_settings(data / "config", data / "data", environ={},
                             encoder_model="minilm", encoder_backend="torch",
                             upstream_url=upstream)
    running = Proxy.open(settings)
    try:
        url = running.start()
        yield Target(int(url.split(":")[2].split("/")[0]), "/v1/models")
    finally:
        running.close()


def loopback(app: object, name: str) -> Iterator[Target]:
    server = LoopbackServer(app, name)
    assert server.start()
    try:
        yield Target(server.port, "/")
    finally:
        server.stop()


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    """No SuperLink behind it: every request here is answered by the gateway itself."""
    app = create_gateway(f"127.0.0.1:{free_port()}", None, tmp_path_factory.mktemp("sigs"))
    yield from loopback(app, "gateway")


@pytest.fixture(scope="module")
def model_endpoint(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    yield from loopback(create_model_app(tmp_path_factory.mktemp("checkpoints")), "models")


@pytest.fixture(scope="module")
def upstream_target(upstream: str) -> Target:
    return Target(int(upstream.rsplit(":", 1)[1]), "/health")


SERVERS = ["proxy", "upstream_target", "gateway", "model_endpoint"]


@pytest.fixture(params=SERVERS)
def target(request: pytest.FixtureRequest) -> Target:
    return request.getfixturevalue(request.param)


def exchange(target: Target, head: bytes, piece: int) -> tuple[int, bytes]:
    """Send ``head`` (then a blank line) in pieces of ``piece`` bytes, until the server
    answers or everything is sent; the status and body of its answer (0 when the
    connection was closed without one)."""
    data = head + b"\r\n"
    answer = b""
    with socket.create_connection(("127.0.0.1", target.port), timeout=30) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            for start in range(0, len(data), piece):
                sock.sendall(data[start:start + piece])
                if piece < len(data) and start % 512 == 0:
                    sock.settimeout(0)  # stop sending once the server has answered
                    try:
                        answer = sock.recv(65536)
                        break
                    except BlockingIOError:
                        pass
                    finally:
                        sock.settimeout(30)
        except OSError:
            pass  # refused while sending: the answer is still to read
        try:
            while chunk := sock.recv(65536):
                answer += chunk
        except OSError:
            pass
    if not answer:
        return 0, b""
    status_line, _, rest = answer.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


def request(target: Target, *headers: bytes, path: str | None = None) -> bytes:
    lines = [b"GET " + (path or target.path).encode() + b" HTTP/1.1", b"Host: 127.0.0.1",
             b"Authorization: Bearer key-one", b"Connection: close", *headers]
    return b"".join(line + b"\r\n" for line in lines)


PIECES = pytest.mark.parametrize("piece", [1 << 24, 1], ids=["one-write", "one-byte"])


@PIECES
@pytest.mark.parametrize("size", [65_000, MAX_HEADER_BYTES + 1])
def test_a_header_over_the_limit_is_refused_however_it_arrives(
        target: Target, size: int, piece: int) -> None:
    status, body = exchange(target, request(target, b"X-Big: " + b"a" * size), piece)
    assert status == 431, (status, body[:200])
    assert f"over {MAX_HEADER_BYTES} bytes".encode() in body and b"X-Big" in body, body
    assert exchange(target, request(target), 1 << 24)[0] not in (0, 400, 414, 431)


@PIECES
def test_a_header_of_15_kib_is_served(target: Target, piece: int) -> None:
    expected = exchange(target, request(target), 1 << 24)[0]
    assert expected not in (0, 400, 414, 431, 500)
    legal = request(target, b"X-Big: " + b"a" * (15 * 1024))
    assert len(legal) < MAX_HEADER_BYTES
    assert exchange(target, legal, piece)[0] == expected


@PIECES
def test_a_request_line_over_the_limit_is_refused(target: Target, piece: int) -> None:
    path = "/" + "a" * MAX_REQUEST_LINE_BYTES
    status, body = exchange(target, request(target, path=path), piece)
    assert status == 414, (status, body[:200])
    assert f"request line is over {MAX_REQUEST_LINE_BYTES} bytes".encode() in body


@PIECES
def test_many_small_headers_over_the_total_are_refused(target: Target, piece: int) -> None:
    """90 fields (fewer than the 100 allowed) of 200 bytes each: 18 KB together."""
    fields = [b"X-F%d: " % n + b"b" * 200 for n in range(90)]
    status, body = exchange(target, request(target, *fields), piece)
    assert status == 431, (status, body[:200])
    assert f"over {MAX_HEADER_BYTES} bytes".encode() in body


def test_a_second_request_on_the_connection_is_counted_on_its_own(
        upstream_target: Target) -> None:
    """Two requests in one write: the first (with a 15 KiB header) is answered, the
    second (with 15 KiB more) is counted from its own first byte and answered too; a
    third over the limit is refused."""
    legal = b"X-Big: " + b"a" * (15 * 1024)
    keep = request(upstream_target, legal).replace(b"Connection: close", b"X-Keep: 1")
    data = keep + b"\r\n" + keep + b"\r\n" + request(upstream_target, legal + b"a" * 2048)
    with socket.create_connection(("127.0.0.1", upstream_target.port), timeout=30) as sock:
        sock.sendall(data + b"\r\n")
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    statuses = [int(part.split(b" ", 1)[0]) for part in answer.split(b"HTTP/1.1 ")[1:]]
    assert statuses == [200, 200, 431], answer[:500]
