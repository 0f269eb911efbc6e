"""The upstream client against a scripted OpenAI-compatible server on loopback: streamed
answers, and a clear UpstreamRequestError for every way an upstream can fail."""

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Iterator

import pytest
import uvicorn
from meancache.client.upstream_client import (
    Completed,
    Delta,
    UpstreamClient,
    UpstreamRejectedError,
    UpstreamUnavailableError,
)
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from tests.upstream_server import free_port

DELTAS = [{"choices": [{"delta": {"content": "Hel"}}]},
          {"choices": [{"delta": {"content": "lo"}, "finish_reason": "stop"}]},
          {"choices": [], "usage": {"prompt_tokens": 12, "completion_tokens": 2,
                                    "prompt_tokens_details": {"cached_tokens": 7}}}]


def events(*chunks: object) -> StreamingResponse:
    async def body() -> AsyncIterator[str]:
        for chunk in chunks:
            yield f"data: {json.dumps(chunk) if not isinstance(chunk, str) else chunk}\n\n"

    return StreamingResponse(body(), media_type="text/event-stream")


def models(request: Request) -> Response:
    return JSONResponse({"data": [{"id": "scripted"}]})


ANSWERS = {
    "ok": lambda: events(*DELTAS, "[DONE]"),
    "broken": lambda: events(DELTAS[0], {"error": {"message": "out of memory"}}),
    "busy": lambda: JSONResponse({"error": {"message": "overloaded"}}, status_code=503),
    "bad": lambda: JSONResponse({"error": {"message": "max_tokens too large"}},
                                status_code=400),
    "plain": lambda: JSONResponse({"choices": [{"message": {"content": "Hello"}}]}),
}


def scripted_app() -> Starlette:
    def answer(kind: str) -> Route:
        return Route("/v1/chat/completions", lambda request: ANSWERS[kind](), methods=["POST"])

    return Starlette(routes=[
        Mount(f"/{kind}", routes=[Route("/v1/models", models), answer(kind)])
        for kind in ANSWERS
    ])


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(scripted_app(), host="127.0.0.1", port=port,
                                           log_config=None))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        threading.Event().wait(0.02)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)


def collect(url: str) -> tuple[list[Delta | Completed], BaseException | None]:
    """Every event the client yielded, and the error that ended the stream, if any."""
    async def run() -> tuple[list[Delta | Completed], BaseException | None]:
        got: list[Delta | Completed] = []
        async with UpstreamClient(url, connect_retries=1) as client:
            try:
                async for event in client.stream_chat([{"role": "user", "content": "hi"}]):
                    got.append(event)
            except Exception as exc:  # the caller asserts which
                return got, exc
        return got, None

    return asyncio.run(run())


def test_streams_deltas_then_usage(server_url: str) -> None:
    got, error = collect(f"{server_url}/ok")
    assert error is None
    assert got[:2] == [Delta("Hel"), Delta("lo")]
    done = got[-1]
    assert isinstance(done, Completed) and len(got) == 3
    assert (done.text, done.prompt_tokens, done.completion_tokens, done.cached_tokens,
            done.finish_reason) == ("Hello", 12, 2, 7, "stop")


def test_an_error_event_mid_answer_raises_after_what_arrived(server_url: str) -> None:
    got, error = collect(f"{server_url}/broken")
    assert got == [Delta("Hel")]
    assert isinstance(error, UpstreamUnavailableError)
    assert str(error) == "the upstream failed mid-answer: out of memory"


def test_a_5xx_is_unavailable_and_a_4xx_is_rejected(server_url: str) -> None:
    _, error = collect(f"{server_url}/busy")
    assert isinstance(error, UpstreamUnavailableError)
    assert str(error) == "the upstream answered 503: overloaded"
    _, error = collect(f"{server_url}/bad")
    assert isinstance(error, UpstreamRejectedError)
    assert (str(error), error.status) == ("max_tokens too large", 400)


def test_an_answer_that_is_not_a_stream_is_a_clear_error(server_url: str) -> None:
    _, error = collect(f"{server_url}/plain")
    assert isinstance(error, UpstreamUnavailableError)
    assert "did not answer with an event stream" in str(error)


def test_an_unreachable_upstream_is_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    _, error = collect(url)
    assert isinstance(error, UpstreamUnavailableError)
    assert str(error).startswith(f"cannot reach the upstream at {url} (")
