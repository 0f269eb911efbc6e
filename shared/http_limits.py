"""What one HTTP client may cost a server before any route sees its request: header size
and count, and the time it may take to send its headers and its body. Every server of
the project (the upstream, the proxy, the FL model endpoint and Fleet gateway, the chat's
embedded upstream) is uvicorn started with :func:`server_config`.

uvicorn 0.49 picks httptools when it is installed, which reads headers of any size (a
128 MB header is parsed before any middleware runs), and neither of its parsers has a
deadline for reading a request: a client that trickles its headers or body (slowloris)
holds its socket forever. So the servers use uvicorn's h11 parser in a subclass of its
protocol that counts the request line and the headers on the bytes received (h11's own
``max_incomplete_event_size`` only counts what is still incomplete after a read, so a
64 KiB header sent in one write passed it) and answers 414 or 431 before they are
parsed, and closes a connection whose headers do not arrive in time; and
:class:`GuardRequests`, ASGI middleware that refuses too many header fields (431) and a
body that does not arrive in time (408).
"""

import asyncio
import errno
import json
import logging
import re
import signal
import socket
from typing import Any

import h11
import uvicorn
from meancache.shared.errors import ConfigError, HeadTooLarge
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.protocols.http.h11_impl import STATUS_PHRASES, H11Protocol

log = logging.getLogger(__name__)

MAX_HEADER_BYTES = 16 * 1024  # the request line and all headers together, as received
MAX_REQUEST_LINE_BYTES = 8 * 1024  # method, target and version
MAX_HEADERS = 100  # header fields in one request
HEADER_SECONDS = 10.0  # to send the request line and headers, from the first byte
BODY_SECONDS = 60.0  # to send the whole body, from the end of the headers
KEEP_ALIVE_SECONDS = 5  # an idle connection between requests
LINGER_SECONDS = 2.0  # reading (and dropping) what a refused client still sends

_END_OF_HEAD = re.compile(b"\n\r?\n")  # h11's own: a blank line, CRLF or bare LF




def check_head(received: bytes | bytearray) -> None:
    """Raise HeadTooLarge when the request starting at ``received`` (the bytes received so
    far, however many reads they took) has a request line over MAX_REQUEST_LINE_BYTES or a
    line and headers over MAX_HEADER_BYTES, without their CRLFs; only the first
    MAX_HEADER_BYTES are ever looked at."""
    line_end = received.find(b"\n", 0, MAX_REQUEST_LINE_BYTES + 2)
    line = len(received) if line_end < 0 else len(received[:line_end].rstrip(b"\r"))
    if line > MAX_REQUEST_LINE_BYTES + (line_end < 0):  # 1: what may still be its CR
        raise HeadTooLarge(414, f"the request line is over {MAX_REQUEST_LINE_BYTES} bytes "
                                f"(method, path and query, version); send a shorter path")
    end = _END_OF_HEAD.search(received, 0, MAX_HEADER_BYTES + 4)
    head = end.start() if end else len(received)
    if head > MAX_HEADER_BYTES + (0 if end else 3):  # 3: what may still be the blank line
        raise HeadTooLarge(431, f"the request line and headers are over {MAX_HEADER_BYTES} "
                                f"bytes{_largest_field(received)}; at most "
                                f"{MAX_HEADER_BYTES} are accepted")


def _largest_field(received: bytes | bytearray) -> str:
    """Which header field received so far is the largest, for the error message."""
    fields = bytes(received[:MAX_HEADER_BYTES + 4]).split(b"\n")[1:]
    if not fields:
        return ""
    largest = max(fields, key=len)
    name = largest.partition(b":")[0][:40].decode("latin-1")
    size = len(largest.rstrip(b"\r"))
    return f" (the largest field, {name!r}, has at least {size} bytes)"


class _HeadLimitedConnection(h11.Connection):
    """h11's server side, with the head of each request checked by ``check_head`` on the
    bytes received before h11 parses it; ``refusal`` keeps what it refused."""

    refusal: HeadTooLarge | None = None

    def _extract_next_receive_event(self) -> Any:
        if self.their_state is h11.IDLE:  # the next request's head starts the buffer
            try:
                check_head(self._receive_buffer._data)  # h11 0.16's buffer
            except HeadTooLarge as exc:
                self.refusal = exc
                raise
        return super()._extract_next_receive_event()


def guarded_h11(header_seconds: float) -> type[H11Protocol]:
    """uvicorn's h11 protocol that closes a connection whose request line and headers
    take longer than ``header_seconds`` to arrive (from connecting, or from the first byte
    of a later request on a kept-alive connection)."""

    class GuardedH11Protocol(H11Protocol):
        _header_timer: asyncio.TimerHandle | None = None
        _refused = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # h11's own limit (on what is incomplete) above this one's, so that a head
            # arriving a byte at a time gets this one's answer
            self.conn: _HeadLimitedConnection = _HeadLimitedConnection(
                h11.SERVER, MAX_HEADER_BYTES + 4)

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._watch_headers()

        def data_received(self, data: bytes) -> None:
            if self._refused:
                return  # dropped until the client stops or LINGER_SECONDS pass
            super().data_received(data)
            self._watch_headers()

        def connection_lost(self, exc: Exception | None) -> None:
            self._stop_watching()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            """uvicorn's answer to a request h11 could not parse: for a head over the
            limits, its status and a JSON error saying which limit; then the connection
            is closed once the client has stopped sending (a close with unread data would
            reset the connection, and the client could lose the answer)."""
            refusal = self.conn.refusal
            if refusal is None:
                super().send_400_response(msg)
                return
            log.warning("refused a request from %s: %s",
                        self.client[0] if self.client else "?", refusal.message)
            body = _error(refusal.message, "request_too_large")
            self.transport.write(self.conn.send(h11.Response(
                status_code=refusal.status, reason=STATUS_PHRASES[refusal.status],
                headers=[(b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()),
                         (b"connection", b"close")])) or b"")
            self.transport.write(self.conn.send(h11.Data(data=body)) or b"")
            self.transport.write(self.conn.send(h11.EndOfMessage()) or b"")
            self._refused = True
            if self.transport.can_write_eof():
                self.transport.write_eof()
            self.loop.call_later(LINGER_SECONDS, self.transport.close)

        def _watch_headers(self) -> None:
            """Headers are awaited while the client's side is IDLE (h11: no request yet)."""
            if self.conn.their_state is not h11.IDLE:
                self._stop_watching()
            elif self._header_timer is None:
                self._header_timer = self.loop.call_later(header_seconds, self._headers_late)

        def _stop_watching(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            self._header_timer = None
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                log.warning("closed a connection from %s: its request headers took over "
                            "%.0f s", self.client[0] if self.client else "?", header_seconds)
                self.transport.close()

    return GuardedH11Protocol


def server_config(app: ASGIApp, header_seconds: float = HEADER_SECONDS,
                  **options: Any) -> uvicorn.Config:
    """uvicorn's Config for ``app`` with this module's limits (``options``: host, port,
    TLS files and the like)."""
    defaults: dict[str, Any] = {"ws": "none", "log_config": None, "access_log": False}
    return uvicorn.Config(app, http=guarded_h11(header_seconds),
                          timeout_keep_alive=KEEP_ALIVE_SECONDS, **(defaults | options))


class _ForegroundServer(uvicorn.Server):
    """uvicorn's server that remembers which signal stopped it."""

    stopped_by: int | None = None

    def handle_exit(self, sig: int, frame: Any) -> None:
        self.stopped_by = sig
        super().handle_exit(sig, frame)


def listening_socket(host: str, port: int) -> socket.socket:
    """A socket bound to ``host``:``port``, taken before a server loads its models: a port
    in use is then said at once, in words, rather than after the load in a log line (uvicorn
    binding it itself logged the error and exited, after the start line said "serving").
    Bound as uvicorn binds its own (IPv6 for an address with a colon, else IPv4)."""
    if not host.strip():  # the socket module reads "" as every interface: never a default
        raise ConfigError("--host is empty; give an address of this machine (127.0.0.1 for "
                          "this machine alone, 0.0.0.0 for every interface)")
    listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
    except (TypeError, ValueError) as exc:  # a name IDNA cannot encode, a NUL in it
        listener.close()
        raise ConfigError(f"cannot listen on {host!r}: not a host name or address ({exc}); "
                          "give --host an address of this machine") from None
    except OSError as exc:
        listener.close()
        if isinstance(exc, socket.gaierror):
            raise ConfigError(f"cannot listen on {host!r}: {exc.strerror}; give --host an "
                              "address of this machine") from None
        why = ("another program listens on it" if exc.errno == errno.EADDRINUSE
               else exc.strerror)
        raise ConfigError(f"cannot listen on {host}:{port}: {why}; stop it or choose "
                          "another --port") from None
    listener.set_inheritable(True)
    return listener


def listener_config(app: ASGIApp, listener: socket.socket, **options: Any) -> uvicorn.Config:
    """``server_config`` for ``app`` served on ``listener`` (its address for the logs)."""
    host, port = listener.getsockname()[:2]
    return server_config(app, host=host, port=port, **options)


def serve_foreground(app: ASGIApp, listener: socket.socket) -> None:
    """Serve ``app`` on ``listener`` (``listening_socket``) until Ctrl+C or SIGTERM, then
    end as that signal would.

    uvicorn shuts down gracefully and raises the signal again, but inside asyncio's runner,
    whose SIGINT handler only cancels a task that may already be done: Ctrl+C then ended
    the run as if nothing had happened (exit status 0) or as an interrupt (130), by timing.
    Ctrl+C always ends in KeyboardInterrupt here, so the caller's ``finally``s and exit
    status are the same every time."""
    server = _ForegroundServer(listener_config(app, listener))
    server.run(sockets=[listener])
    if server.stopped_by == signal.SIGINT:
        raise KeyboardInterrupt


def error_body(message: str, kind: str, code: str | None = None,
               param: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape: what every server of the project answers an error with."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def _error(message: str, code: str) -> bytes:
    return json.dumps(error_body(message, "invalid_request_error", code)).encode()


class GuardRequests:
    """ASGI middleware: 431 for a request with more than ``max_headers`` header fields;
    408 (and the connection closed) when its body has not fully arrived ``body_seconds``
    after the app first asks for it (the app then reads a disconnect); and the connection
    closed after any answer sent before the body was read."""

    def __init__(self, app: ASGIApp, max_headers: int = MAX_HEADERS,
                 body_seconds: float = BODY_SECONDS) -> None:
        self.app = app
        self.max_headers = max_headers
        self.body_seconds = body_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        if len(scope["headers"]) > self.max_headers:
            await _respond(send, 431, _error(
                f"the request has {len(scope['headers'])} header fields; at most "
                f"{self.max_headers} are accepted", "too_many_headers"))
            return
        loop = asyncio.get_running_loop()
        deadline: float | None = None
        body_done = not _has_body(scope)
        timed_out = started = False

        async def receive_in_time() -> Message:
            nonlocal deadline, body_done, timed_out
            if body_done:  # after the body: a disconnect may be awaited for as long as it takes
                return await receive()
            if timed_out:
                return {"type": "http.disconnect"}
            deadline = deadline or loop.time() + self.body_seconds
            try:
                async with asyncio.timeout_at(deadline):
                    message = await receive()
            except TimeoutError:
                timed_out = True
                if not started:
                    await _respond(send, 408, _error(
                        f"the request body did not arrive within {self.body_seconds:.0f} s",
                        "request_timeout"))
                return {"type": "http.disconnect"}
            body_done = message["type"] != "http.request" or not message.get("more_body")
            return message

        async def send_unless_answered(message: Message) -> None:
            nonlocal started
            if timed_out and not started:
                return  # the 408 went out instead
            if message["type"] == "http.response.start" and not body_done:
                # Answered before its body was read (401, 413, 415...): close the connection
                # after the answer instead of reading the rest of the body to discard it.
                message = {**message, "headers": [*message.get("headers", ()),
                                                  (b"connection", b"close")]}
            started = True
            await send(message)

        await self.app(scope, receive_in_time, send_unless_answered)


def _has_body(scope: Scope) -> bool:
    """Whether the request says a body follows its headers."""
    headers = dict(scope["headers"])
    return b"transfer-encoding" in headers or headers.get(b"content-length", b"0") != b"0"


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
