"""Requests the cache must not answer go to the upstream as the app sent them, and the
upstream's answer comes back checked, never trusted: a whole answer must be one JSON
object of bounded size, a streamed one events that are JSON objects (or ``[DONE]``);
anything else ends the answer with an error the app can read. Nothing is stored."""

import json
import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError
from meancache.client.errors import ProxyRequestError, UpstreamRequestError
from meancache.client.http_errors import describe
from meancache.client.proxy.wire import header
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.http_limits import error_body
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response, StreamingResponse

log = logging.getLogger(__name__)

MAX_ANSWER_BYTES = 8 * 1024 * 1024  # of a whole answer from the upstream


def sse(data: dict[str, Any] | str) -> str:
    return f"data: {data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)}\n\n"


def stream_error(message: str) -> str:
    """The event that ends a stream that failed after its headers were sent."""
    return sse(error_body(message, "upstream_error"))


def _bad_answer(what: str) -> ProxyRequestError:
    return ProxyRequestError(502, f"the upstream's answer was not usable: {what}",
                             "bad_upstream_answer", kind="upstream_error")


async def relay(upstream: UpstreamClient, body: bytes, stream: bool, reason: str) -> Response:
    """The upstream's answer to ``body``, marked ``x-meancache: bypass; reason=...``."""
    stack = AsyncExitStack()
    response = await stack.enter_async_context(upstream.relay_chat(body))
    headers = header(None, reason)
    if not stream:
        try:
            data = b""
            async for chunk in response.aiter_bytes():
                data += chunk
                if len(data) > MAX_ANSWER_BYTES:
                    raise _bad_answer(f"over {MAX_ANSWER_BYTES} bytes")
        except httpx.TransportError as exc:
            raise _bad_answer(f"the connection broke ({describe(exc)})") from None
        finally:
            await stack.aclose()
        try:
            answer = json.loads(data)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise _bad_answer("not a JSON object")
        return JSONResponse(answer, headers=headers)
    if not response.headers.get("content-type", "").startswith("text/event-stream"):
        await stack.aclose()
        raise _bad_answer("not an event stream")
    return StreamingResponse(_events(response, stack), media_type="text/event-stream",
                             headers=headers, background=BackgroundTask(stack.aclose))


async def _events(response: httpx.Response, stack: AsyncExitStack) -> AsyncIterator[str]:
    try:
        async for event in EventSource(response).aiter_sse():
            if event.data == "[DONE]":
                yield sse("[DONE]")
                return
            try:
                chunk = json.loads(event.data)
            except ValueError:
                chunk = None
            if not isinstance(chunk, dict):
                yield stream_error("the upstream sent an event that is not a JSON object")
                return
            yield sse(chunk)
    except (SSEError, httpx.TransportError, UpstreamRequestError) as exc:
        log.warning("relayed stream failed: %s", describe(exc))
        yield stream_error(f"the upstream's stream broke ({describe(exc)})")
    finally:
        await stack.aclose()
