"""Upstream servers on loopback for tests, stopped when the block ends: the real one, and a
scripted OpenAI-compatible stub for the faults a real server cannot produce on demand."""

import asyncio
import json
import re
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager

import httpx
from meancache.shared.loopback_server import LoopbackServer
from meancache.shared.processes import free_port
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.serve import BackgroundServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.types import ASGIApp

__all__ = ["ECHO_MODEL", "LONG_LINES", "RECEIVED", "SCRIPTED_MODEL", "closes_trickled_headers",
           "echo_upstream", "free_port", "module_tokens", "running_upstream", "scripted_upstream",
           "serving", "wait_for_port"]

SCRIPTED_MODEL = "scripted"
RECEIVED: list[dict[str, object]] = []  # every chat request body the stub was sent, in order


@contextmanager
def running_upstream(model: str = "builtin:tiny",
                     settings: ServerSettings | None = None) -> Iterator[str]:
    """Yields the base URL of a server running ``model`` until the block ends."""
    with BackgroundServer(model, settings) as server:
        yield server.url


DELTAS = [{"choices": [{"delta": {"content": "Hel"}}]},
          {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
          {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2,
                                    "prompt_tokens_details": {"cached_tokens": 7}}}]


def events(*chunks: object, pause: float = 0.0) -> StreamingResponse:
    """``chunks`` as server-sent events, ``pause`` seconds apart."""
    async def body() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk) if not isinstance(chunk, str) else chunk}\n\n"
            if pause:
                await asyncio.sleep(pause)

    return StreamingResponse(body(), media_type="text/event-stream")


LONG_LINES = 60


def long_answer() -> StreamingResponse:
    """An answer of LONG_LINES lines (more than a screen), one line an event, streamed over
    a few seconds so that a test can scroll while it comes."""
    lines = [{"choices": [{"delta": {"content": f"Line {n} of the long answer.\n\n"}}]}
             for n in range(1, LONG_LINES + 1)]
    end = {"choices": [{"delta": {}, "finish_reason": "stop"}],
           "usage": {"prompt_tokens": 9, "completion_tokens": 6 * LONG_LINES}}
    return events(*lines, end, "[DONE]", pause=0.05)


def listed(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [{"id": SCRIPTED_MODEL}]})


def refused_key(request: Request | None = None) -> Response:
    return JSONResponse({"error": {"message": "Incorrect API key provided"}}, status_code=401)


# Each kind is mounted at /KIND: its /v1/chat/completions answers so, and its /v1/models
# lists SCRIPTED_MODEL (or, for "locked", refuses the key as a server with a key does).
ANSWERS: dict[str, Callable[[], Response]] = {
    "ok": lambda: events(*DELTAS, "[DONE]"),
    "broken": lambda: events(DELTAS[0], {"error": {"message": "out of memory"}}),
    "busy": lambda: JSONResponse({"error": {"message": "overloaded"}}, status_code=503),
    "bad": lambda: JSONResponse({"error": {"message": "max_tokens too large"}},
                                status_code=400),
    "plain": lambda: JSONResponse({"choices": [{"message": {"content": "Hello"}}]}),
    # llama.cpp serving a base model under a chat format: the model ends at once
    "empty": lambda: events({"choices": [{"delta": {"role": "assistant", "content": " \n"}}]},
                            {"choices": [{"delta": {}, "finish_reason": "stop"}]}, "[DONE]"),
    "locked": refused_key,
    "long": long_answer,
}


ECHO_MODEL = "echo"


def echo_app(received: list[dict[str, object]],
             headers: list[dict[str, str]] | None = None) -> Starlette:
    """An OpenAI-compatible upstream whose answers name the last user message and count
    up ("Answer 3: ..."), so that a fresh answer differs from a cached one; whole or
    streamed in three pieces, with usage; every request body is appended to
    ``received`` (and its headers to ``headers``)."""
    count = 0

    async def chat(request: Request) -> Response:
        nonlocal count
        body = await request.json()
        received.append(body)
        if headers is not None:
            headers.append(dict(request.headers))
        count += 1
        text = f"Answer {count}: {body['messages'][-1]['content']}"
        usage = {"prompt_tokens": 10, "completion_tokens": 3, "total_tokens": 13,
                 "prompt_tokens_details": {"cached_tokens": 0}}
        head = {"id": f"up-{count}", "created": 0, "model": ECHO_MODEL}
        if not body.get("stream"):
            return JSONResponse(head | {"object": "chat.completion", "usage": usage,
                                        "choices": [{"index": 0, "finish_reason": "stop",
                                                     "message": {"role": "assistant",
                                                                 "content": text}}]})
        third = len(text) // 3
        pieces = [text[:third], text[third:2 * third], text[2 * third:]]
        chunk = head | {"object": "chat.completion.chunk"}
        return events(*[chunk | {"choices": [{"index": 0, "delta": {"content": piece},
                                              "finish_reason": None}]} for piece in pieces],
                      chunk | {"choices": [{"index": 0, "delta": {},
                                            "finish_reason": "stop"}]},
                      chunk | {"choices": [], "usage": usage}, "[DONE]")

    def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": ECHO_MODEL, "object": "model"}]})

    return Starlette(routes=[Route("/v1/models", models),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


@contextmanager
def echo_upstream(received: list[dict[str, object]] | None = None,
                  headers: list[dict[str, str]] | None = None) -> Iterator[str]:
    """Yields the base URL of an echo upstream (``echo_app``) until the block ends."""
    with serving(echo_app([] if received is None else received, headers)) as url:
        yield url


def scripted_app() -> Starlette:
    def mount(kind: str) -> Mount:
        models = refused_key if kind == "locked" else listed

        async def chat(request: Request) -> Response:
            RECEIVED.append(await request.json())
            return ANSWERS[kind]()

        return Mount(f"/{kind}", routes=[
            Route("/v1/models", models),
            Route("/v1/chat/completions", chat, methods=["POST"]),
        ])

    return Starlette(routes=[mount(kind) for kind in ANSWERS])


@contextmanager
def scripted_upstream() -> Iterator[str]:
    """Yields the root URL of the stub; ``{url}/KIND`` is one scripted upstream."""
    with serving(scripted_app()) as url:
        yield url


@contextmanager
def serving(app: ASGIApp) -> Iterator[str]:
    """Serves ``app`` on loopback until the block ends; yields its base URL."""
    server = LoopbackServer(app, "test-server", lifespan="off", ws="none")
    assert server.start(), "the server did not start"
    try:
        yield server.url
    finally:
        server.stop()


def wait_for_port(port: int, seconds: float = 60) -> None:
    """Until something listens on the loopback ``port`` (a server another process starts)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise AssertionError(f"nothing listens on port {port}")


def closes_trickled_headers(port: int, request_line: bytes, seconds: float) -> bool:
    """Send ``request_line`` and then one header line every 0.25 s (slowloris) for up to
    ``seconds``; whether the server closed the connection in that time."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(request_line)
        for _ in range(int(seconds / 0.25)):
            time.sleep(0.25)
            try:
                sock.sendall(b"X-A: b\r\n")
                sock.settimeout(0.01)
                if sock.recv(1) == b"":
                    return True
            except TimeoutError:
                pass
            except OSError:
                return True
            sock.settimeout(30)
    return False


def module_tokens(upstream: str) -> int:
    """Prompt tokens the upstream read back from modules (cached minus prefix blocks)."""
    metrics = httpx.get(f"{upstream}/metrics").text

    def total(name: str) -> int:
        found = re.search(rf"^meancache_upstream_{name}_total (\S+)$", metrics, re.M)
        assert found is not None, name
        return int(float(found[1]))
    return total("cached_tokens") - total("prefix_reused_tokens")
