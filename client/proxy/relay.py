"""Requests the cache must not answer go to the upstream as the app sent them, and the
upstream's answer comes back checked, never trusted, before it is relayed: a whole answer
must be a chat completion (``UpstreamCompletion``) and each streamed event a chunk
(``UpstreamChunk``) or ``[DONE]``; anything else is a 502 (or, once a stream has started,
an error event that ends it). What the upstream may send is bounded by the tokens asked
for (``AnswerCaps``): past that an answer is cut, its finish reason ``length`` and its
``meancache.cut`` saying why; and it has ANSWER_SECONDS in all. Nothing is stored. An app
never sees the upstream's own error text or its URL (they go to the log)."""

import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import AsyncExitStack
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError
from meancache.client.errors import ProxyRequestError, StreamTooLong, UpstreamRequestError
from meancache.client.http_errors import describe
from meancache.client.proxy.wire import (
    ChatRequest,
    UpstreamChunk,
    UpstreamCompletion,
    checked_answer,
    header,
)
from meancache.client.upstream_client import AnswerCaps, UpstreamClient
from meancache.shared.http_limits import error_body
from meancache.shared.pml.marks import MAX_MARKS
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 8 * 1024 * 1024  # of a whole answer from the upstream, whatever was asked
RELAY_TOKENS = 4096  # the tokens a relayed request without max_tokens may be answered with


def relay_caps(asked: ChatRequest) -> AnswerCaps:
    """What the upstream may send for ``asked``: the tokens it asked for, for each of its
    ``n`` choices."""
    tokens = asked.max_completion_tokens or asked.max_tokens or RELAY_TOKENS
    return AnswerCaps(tokens * (asked.n or 1))


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def stream_error(message: str) -> str:
    """The event that ends a stream that failed after its headers were sent."""
    return sse(error_body(message, "upstream_error"))


def told(exc: Exception) -> str:
    """What an app is told of a failure: an upstream's in the proxy's own words."""
    return exc.public if isinstance(exc, UpstreamRequestError) else str(exc)


def _bad_answer(what: str) -> ProxyRequestError:
    return ProxyRequestError(502, f"the upstream's answer was not usable: {what}",
                             "bad_upstream_answer", kind="upstream_error")


def recurring(asked: ChatRequest) -> list[int]:
    """The app's system messages (not the last message): text that recurs from request to
    request, marked for the upstream to keep as modules (shared.pml.marks)."""
    found = [i for i, message in enumerate(asked.messages[:-1])
             if message.role == "system" and isinstance(message.content, str)]
    return found[:MAX_MARKS]


async def relay(upstream: UpstreamClient, body: bytes, stream: bool, reason: str,
                caps: AnswerCaps, modules: Sequence[int] = ()) -> Response:
    """The upstream's answer to ``body`` (its ``modules`` marked), marked
    ``x-meancache: bypass; reason=...``."""
    deadline = upstream.deadline()
    stack = AsyncExitStack()
    max_bytes = caps.stream_bytes if stream else MAX_ANSWER_BYTES  # a whole one is cut parsed
    async with upstream.in_time(deadline):
        response = await stack.enter_async_context(upstream.relay_chat(body, max_bytes,
                                                                       modules))
    headers = header(None, reason)
    if not stream:
        try:
            async with upstream.in_time(deadline):
                data = await response.aread()
        except StreamTooLong:
            raise _bad_answer(f"over {max_bytes} bytes") from None
        except httpx.TransportError as exc:
            log.warning("a relayed answer broke: %s", describe(exc))
            raise _bad_answer("the connection broke mid-answer") from None
        finally:
            await stack.aclose()
        return JSONResponse(_whole(data, caps), headers=headers)
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        await stack.aclose()
        raise _bad_answer("not an event stream")
    return StreamingResponse(_events(upstream, response, stack, caps, deadline),
                             media_type="text/event-stream", headers=headers,
                             background=BackgroundTask(stack.aclose))


def _whole(data: bytes, caps: AnswerCaps) -> dict[str, Any]:
    """A whole answer checked, its text cut to the caps (and marked) where it is over."""
    try:
        answer = json.loads(data)
    except (ValueError, RecursionError):
        raise _bad_answer("not JSON") from None
    checked = checked_answer(UpstreamCompletion, answer)
    if isinstance(checked, str):
        raise _bad_answer(f"not a chat completion ({checked})")
    cut = None
    if checked.usage is not None and checked.usage.completion_tokens > caps.tokens:
        cut = caps.past(checked.usage.completion_tokens, 0)
    for index, choice in enumerate(checked.choices):
        text = (choice.message.content or "").encode()
        if len(text) > caps.text_bytes:
            cut = caps.past(0, len(text))
            answer["choices"][index]["message"]["content"] = \
                text[:caps.text_bytes].decode(errors="ignore")
    if cut is not None:
        for choice in answer["choices"]:
            choice["finish_reason"] = "length"
        answer["meancache"] = {"source": "upstream", "cut": cut}
    return dict(answer)


async def _events(upstream: UpstreamClient, response: httpx.Response, stack: AsyncExitStack,
                  caps: AnswerCaps, deadline: float) -> AsyncIterator[str]:
    pieces = size = 0
    last: dict[str, Any] = {}
    events = EventSource(response).aiter_sse()
    try:
        while True:
            async with upstream.in_time(deadline):
                event = await anext(events, None)
            if event is None or event.data == "[DONE]":
                yield sse("[DONE]")
                return
            try:
                chunk = json.loads(event.data)
            except (ValueError, RecursionError):
                chunk = None
            if isinstance(chunk, dict) and "error" in chunk:
                log.warning("the upstream failed mid-answer: %.200s", event.data)
                yield stream_error("the upstream failed mid-answer")
                return
            checked = checked_answer(UpstreamChunk, chunk)
            if isinstance(checked, str):
                yield stream_error(f"the upstream sent an event that is not a chat-completion "
                                   f"chunk ({checked})")
                return
            for choice in checked.choices:
                if choice.delta.content:
                    pieces, size = pieces + 1, size + len(choice.delta.content.encode())
            cut = caps.past(pieces, size)
            if cut is not None:
                yield _cut(last, cut)
                return
            last = chunk
            yield sse(chunk)
    except StreamTooLong:
        yield _cut(last, caps.too_long())
    except (SSEError, httpx.TransportError, UpstreamRequestError) as exc:
        log.warning("relayed stream failed: %s", describe(exc))
        yield stream_error(told(exc) if isinstance(exc, UpstreamRequestError)
                           else "the upstream's stream broke off")
    finally:
        await events.aclose()
        await stack.aclose()


def _cut(last: dict[str, Any], why: str) -> str:
    """The events that end a stream cut at its caps: a last chunk saying so, and [DONE]."""
    head = {key: last[key] for key in ("id", "object", "created", "model") if key in last}
    return sse(head | {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                       "meancache": {"source": "upstream", "cut": why}}) + sse("[DONE]")
