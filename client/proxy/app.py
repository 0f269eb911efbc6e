"""The proxy's HTTP API (Starlette): ``/v1/chat/completions`` (whole and streamed),
``/v1/models``, ``/v1/meancache/feedback`` and ``/v1/meancache/stats`` (the app's own
caches: hit rate and the learned wrong rate with its bound), on paths normalised before routing
(``//v1/models/`` is ``/v1/models``); any other path is a 404 and any other method a
405, in OpenAI's error shape. Each request is checked in order before it costs anything:
header count and body time (GuardRequests), Host (loopback names only), the app's key,
the media type, the body's size, then its fields (pydantic).

An answerable question goes through the app's cache exactly as the chat's does
(``AnswerService``: pack, semantic cache, upstream); anything else is relayed.
"""

import asyncio
import contextlib
import logging
import re
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass

from meancache.client.chat.answering import AnswerService
from meancache.client.chat.conversations import Conversation, Turn
from meancache.client.chat.rejection import reject_last
from meancache.client.errors import (
    CacheError,
    ProxyRequestError,
    RejectionError,
    UpstreamRejectedError,
    UpstreamRequestError,
    UpstreamUnavailableError,
)
from meancache.client.proxy.apps import APP_HEADER, App, Apps
from meancache.client.proxy.eligibility import Bypass, Question, answer_budget, question_of
from meancache.client.proxy.partitions import Partitions
from meancache.client.proxy.relay import recurring, relay, relay_caps, sse, stream_error, told
from meancache.client.proxy.wire import (
    HEADER,
    ChatRequest,
    Completion,
    FeedbackRequest,
    header,
    model_list,
    parse,
    stats_body,
)
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.errors import MeanCacheError
from meancache.shared.hosts import host_name
from meancache.shared.http_limits import GuardRequests, error_body
from starlette.applications import Starlette
from starlette.background import BackgroundTask, BackgroundTasks
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 4 * 1024 * 1024
RESPONSE_ID = re.compile(r"chatcmpl-([0-9a-f]{16})([0-9a-f]{32})")
ROUTES = "/v1/chat/completions, /v1/models, /v1/meancache/feedback and /v1/meancache/stats"


@dataclass
class ProxyState:
    """What the routes share: set up once by client/proxy/service.py."""

    apps: Apps
    partitions: Partitions
    upstream: UpstreamClient
    model: str  # the upstream model the cache asks, and the answers it holds are from
    answer_max_tokens: int
    greedy_only: bool
    hosts: frozenset[str] | None  # Host names answered (None: any)
    max_body_bytes: int = MAX_BODY_BYTES


class NormalisePath:
    """ASGI middleware: repeated slashes become one, a trailing slash goes."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            path = re.sub("/{2,}", "/", scope["path"])
            scope = {**scope, "path": path.rstrip("/") or "/"}
        await self.app(scope, receive, send)


def create_app(state: ProxyState) -> Starlette:
    def identify(request: Request) -> App:
        if state.hosts is not None:
            given = request.headers.get("host", "")
            if host_name(given) not in state.hosts:
                raise ProxyRequestError(400, f"this proxy answers only to "
                                        f"{', '.join(sorted(state.hosts))}; the request named "
                                        f"{given[:100]!r} in its Host header",
                                        "host_not_allowed")
        return state.apps.identify(request.headers.get("authorization", ""),
                                   request.headers.get(APP_HEADER))

    async def read_json_body(request: Request) -> bytes:
        declared = request.headers.get("content-type", "")
        if declared.partition(";")[0].strip().lower() != "application/json":
            raise ProxyRequestError(415, "send the body as application/json (with that "
                                    f"Content-Type); got {declared[:100]!r}",
                                    "unsupported_media_type")
        too_large = ProxyRequestError(413, f"the request body is over {state.max_body_bytes} "
                                      "bytes", "request_too_large")
        length = request.headers.get("content-length", "")
        if length.isdigit() and int(length) > state.max_body_bytes:
            raise too_large
        body = b""
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > state.max_body_bytes:
                    raise too_large
        except ClientDisconnect:
            raise ProxyRequestError(499, "the client closed the connection mid-request",
                                    "client_closed_request") from None
        return body

    async def models(request: Request) -> Response:
        identify(request)
        return JSONResponse(model_list(await asyncio.to_thread(state.upstream.served_models)))

    async def chat(request: Request) -> Response:
        app = identify(request)
        body = await read_json_body(request)
        asked = parse(ChatRequest, body)
        stream = bool(asked.stream)
        found = question_of(asked, state.model, state.greedy_only)
        budget = answer_budget(asked, state.answer_max_tokens)
        caps = relay_caps(asked)
        marked = recurring(asked)
        if isinstance(found, Bypass):
            return await relay(state.upstream, body, stream, found.reason, caps, marked)
        partition = await asyncio.to_thread(state.partitions.get, app.namespace,
                                            found.preamble)
        if isinstance(partition, Bypass):
            return await relay(state.upstream, body, stream, partition.reason, caps, marked)
        streaming = False  # a stream releases the cache once it is sent
        try:
            conversation = await _conversation(partition.exchanges.known, found)
            if conversation is None:
                return await relay(state.upstream, body, stream, "history", caps, marked)
            completion = Completion(f"chatcmpl-{partition.id}{conversation.id}", state.model)
            if not stream:
                turn = await partition.answers.answer(conversation, found.text,
                                                      asked_by=app.label, max_tokens=budget)
                return JSONResponse(completion.whole(turn), headers=header(turn))
            response = await _streamed(partition.answers, conversation, found.text,
                                       app.label, budget, completion, asked.include_usage,
                                       BackgroundTask(state.partitions.release, partition))
            streaming = True
            return response
        finally:
            if not streaming:
                await asyncio.to_thread(state.partitions.release, partition)

    async def feedback(request: Request) -> Response:
        app = identify(request)
        asked = parse(FeedbackRequest, await read_json_body(request))
        found = RESPONSE_ID.fullmatch(asked.id)
        partition = None if found is None else await asyncio.to_thread(
            state.partitions.find, app.namespace, found[1])
        try:
            conversation = None if partition is None or found is None else \
                await asyncio.to_thread(partition.exchanges.load, found[2])
            if partition is None or conversation is None or found is None:
                raise ProxyRequestError(404, f"no answer {asked.id[:80]!r} of this app is "
                                        "known here (an id from another app, or forgotten)",
                                        "response_not_found", "id")
            correction = await reject_last(partition.answers, conversation,
                                           asked_by=app.label)
        finally:
            if partition is not None:
                await asyncio.to_thread(state.partitions.release, partition)
        turn = correction.turn
        answer = Completion(asked.id, state.model).whole(turn)
        answer["meancache"] |= {"rejected": True, "threshold": None if correction.threshold
                                is None else str(correction.threshold)}
        return JSONResponse(answer, headers=header(turn))

    async def stats(request: Request) -> Response:
        app = identify(request)  # an app sees its own caches' statistics, no other's
        return JSONResponse(stats_body(await asyncio.to_thread(state.partitions.stats,
                                                               app.namespace)))

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]),
              Route("/v1/models", models, methods=["GET"]),
              Route("/v1/meancache/feedback", feedback, methods=["POST"]),
              Route("/v1/meancache/stats", stats, methods=["GET"])]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        state.partitions.close()
        await state.upstream.aclose()

    return Starlette(routes=routes, exception_handlers=_handlers(), lifespan=lifespan,
                     middleware=[Middleware(GuardRequests), Middleware(NormalisePath)])


async def _conversation(known: Callable[[tuple[tuple[str, str], ...]], Conversation | None],
                        found: Question) -> Conversation | None:
    """A new conversation for the question: after the turns the cache answered before
    (None when the request's turns are not ones it answered)."""
    conversation = Conversation(id=uuid.uuid4().hex)
    if found.history:
        before = await asyncio.to_thread(known, found.history)
        if before is None:
            return None
        conversation.turns = list(before.turns)
        conversation.title = before.title
    return conversation


async def _answer_events(answers: AnswerService, conversation: Conversation, question: str,
                         asked_by: str, budget: int | None) -> AsyncIterator[str | Turn]:
    """The answer's pieces as the upstream streams them, then its turn (a cache's answer:
    the turn alone). Leaving early cancels the answer: nothing half-made is stored."""
    queue: asyncio.Queue[str | Turn | BaseException] = asyncio.Queue()

    async def run() -> None:
        try:
            await queue.put(await answers.answer(conversation, question, queue.put, asked_by,
                                                 budget))
        except Exception as exc:  # raised to the reader below
            await queue.put(exc)

    task = asyncio.create_task(run())
    try:
        while True:
            item = await queue.get()
            if isinstance(item, BaseException):
                raise item
            yield item
            if isinstance(item, Turn):
                return
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def _streamed(answers: AnswerService, conversation: Conversation, question: str,
                    asked_by: str, budget: int | None, completion: Completion,
                    include_usage: bool, after: BackgroundTask) -> Response:
    """The answer as SSE. Its headers wait for the first piece (or a cache's answer), so
    that ``x-meancache`` can say which it is and an early failure is a plain error.
    ``after`` runs once the response is over (sent, or its client gone)."""
    events = _answer_events(answers, conversation, question, asked_by, budget)
    first = await anext(events)

    async def body() -> AsyncIterator[str]:
        yield sse(completion.chunk({"role": "assistant", "content": ""}))
        try:
            item = first
            while not isinstance(item, Turn):
                yield sse(completion.chunk({"content": item}))
                item = await anext(events)
            if isinstance(first, Turn) and first.answer:  # nothing was streamed
                yield sse(completion.chunk({"content": first.answer}))
            yield sse(completion.chunk({}, item))
            if include_usage:
                yield sse(completion.usage_chunk(item))
            yield sse("[DONE]")
        except MeanCacheError as exc:
            log.warning("a streamed answer failed: %s", exc)
            yield stream_error(told(exc))
        except Exception:
            log.exception("a streamed answer failed")
            yield stream_error("the proxy failed on this answer (its log has the details)")
        finally:
            await events.aclose()

    shown = first if isinstance(first, Turn) else None
    return StreamingResponse(body(), media_type="text/event-stream",
                             headers=header(shown) if shown else {HEADER: "miss"},
                             background=BackgroundTasks([  # a client gone early, too
                                 BackgroundTask(events.aclose), after]))


# errors ------------------------------------------------------------------------------
def _json_error(status: int, message: str, kind: str, code: str | None = None,
                param: str | None = None) -> Response:
    return JSONResponse(error_body(message, kind, code, param), status_code=status)


async def _refused(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, ProxyRequestError)
    return _json_error(exc.status, str(exc), exc.kind, exc.code, exc.param)


async def _upstream_failed(request: Request, exc: Exception) -> Response:
    """The upstream's refusal keeps its status, except one of the proxy's own key (the
    app's key was fine); an unreachable or failing upstream is a 502 (429 stays 429). The
    app reads what happened in the proxy's words (``public``); the upstream's own message
    and URL go to the log only."""
    assert isinstance(exc, UpstreamRequestError)
    log.warning("the upstream could not answer %s %s: %s", request.method, request.url.path,
                exc)
    if isinstance(exc, UpstreamRejectedError) and 400 <= exc.status < 500 \
            and exc.status not in (401, 403):
        return _json_error(exc.status, exc.public, "invalid_request_error", "upstream_refused")
    status = 429 if isinstance(exc, UpstreamUnavailableError) and exc.status == 429 else 502
    return _json_error(status, exc.public, "upstream_error", "upstream_unavailable")


async def _other(request: Request, exc: Exception) -> Response:
    if isinstance(exc, CacheError):
        return _json_error(503, f"the cache cannot be used: {exc}", "server_error",
                           "cache_unavailable")
    if isinstance(exc, RejectionError):
        return _json_error(400, str(exc), "invalid_request_error", "not_rejectable")
    return _json_error(400, str(exc), "invalid_request_error")


async def _http(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        return _json_error(404, f"no route {request.method} {request.url.path[:100]}; this "
                           f"proxy serves {ROUTES}", "invalid_request_error", "not_found")
    allowed = (exc.headers or {}).get("Allow", "")
    return _json_error(exc.status_code, f"{request.method} is not allowed here; use {allowed}",
                       "invalid_request_error", "method_not_allowed")


async def _internal(request: Request, exc: Exception) -> Response:
    log.error("the proxy failed on %s %s", request.method, request.url.path, exc_info=exc)
    return _json_error(500, "the proxy failed on this request (its log has the details)",
                       "server_error")


def _handlers() -> dict[object, object]:
    return {ProxyRequestError: _refused, UpstreamRequestError: _upstream_failed,
            MeanCacheError: _other, HTTPException: _http, Exception: _internal}
