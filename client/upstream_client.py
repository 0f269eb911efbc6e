"""Talking to the upstream: any OpenAI-compatible server, plus meancache's module marks
(shared.pml.marks: a header other servers ignore) and instruction packs. Every request the
client side sends to the upstream goes through
``UpstreamClient``: the chat and `meancache ask` (streamed answers), the start
check, and the pack download (`meancache pack update` and the chat's pack action).

A base URL is taken with or without its ``/v1`` (``http://host:8080`` and
``http://host:8080/v1/`` name the same server), as OpenAI clients take ``OPENAI_BASE_URL``.

Streams chat completions over SSE (httpx-sse). Only the connection is retried (httpx's
transport retries, with backoff): nothing has been sent then, so an answer is never
restarted. Every transport or HTTP failure becomes an UpstreamRequestError subclass with a
message for the user.

An upstream is untrusted: besides the read timeout between bytes, an answer has an overall
deadline (``answer_seconds``), and what it may send is bounded by the tokens asked for
(``AnswerCaps``): past them the answer is cut (``Completed.cut``), never stored; an error
body is read only up to MAX_ERROR_BYTES.

httpx, not the openai SDK: against the tiny upstream the SDK's first token came no sooner
(paired median ratio 0.90-0.94 in httpx's favour), a process that asks once ran 2.6x as
long (its import: 0.68 s vs 0.26 s), and it does not resume a download.
"""

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError, aconnect_sse
from meancache.client.errors import (
    StreamTooLong,
    UpstreamRejectedError,
    UpstreamUnavailableError,
)
from meancache.client.http_errors import describe, error_message
from meancache.shared.pml.marks import MODULES_HEADER, write_marks

# What an answer is asked with unless the settings say otherwise (client.config's defaults).
DEFAULT_MAX_TOKENS = 512
DEFAULT_TEMPERATURE = 0.0  # greedy: a cached answer should be the model's best one

ANSWER_SECONDS = 600.0  # one answer, from the request to its last byte
TEXT_BYTES_PER_TOKEN = 32  # of an answer's text (a token is a few bytes of UTF-8)
STREAM_BYTES_PER_TOKEN = 4096  # of its events as sent (JSON around each piece, logprobs)
STREAM_BYTES_SLACK = 64 * 1024  # the events without a piece: role, finish, usage

MODELS = "/v1/models"
MAX_MODEL_LIST_BYTES = 1024 * 1024  # a model list is a few hundred bytes
MAX_MODEL_ID_CHARS = 256


def api_root(url: str) -> str:
    """The server's root: ``url`` without trailing slashes and without a final ``/v1``."""
    root = url.strip().rstrip("/")
    return root.removesuffix("/v1").rstrip("/")


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Completed:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int  # prompt tokens the upstream reused (Prompt Cache modules, cached prefixes)
    ttft_seconds: float  # as this client saw it
    finish_reason: str | None
    cut: str | None = None  # why this client cut the answer short (never stored then)


@dataclass(frozen=True)
class AnswerCaps:
    """What an upstream may send for an answer of ``tokens`` tokens: as many pieces (an
    honest server sends at least a token a piece), ``text_bytes`` of text and
    ``stream_bytes`` in all."""

    tokens: int

    @property
    def text_bytes(self) -> int:
        return self.tokens * TEXT_BYTES_PER_TOKEN

    @property
    def stream_bytes(self) -> int:
        return self.tokens * STREAM_BYTES_PER_TOKEN + STREAM_BYTES_SLACK

    def past(self, pieces: int, text_bytes: int) -> str | None:
        """Why an answer of ``pieces`` pieces and ``text_bytes`` bytes of text is past
        these caps, or None."""
        if pieces > self.tokens:
            return f"the upstream sent more than the {self.tokens} tokens asked for"
        if text_bytes > self.text_bytes:
            return (f"the upstream sent over {self.text_bytes} bytes of text for "
                    f"{self.tokens} tokens")
        return None

    def too_long(self) -> str:
        return f"the upstream sent over {self.stream_bytes} bytes for {self.tokens} tokens"



class _CappedStream(httpx.AsyncByteStream):
    def __init__(self, stream: httpx.AsyncByteStream, max_bytes: int) -> None:
        self._stream = stream
        self._max_bytes = max_bytes

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._stream:
            seen += len(chunk)
            if seen > self._max_bytes:
                raise StreamTooLong
            yield chunk

    async def aclose(self) -> None:
        await self._stream.aclose()


def cap_stream(response: httpx.Response, max_bytes: int) -> None:
    """Make reading ``response``'s body past ``max_bytes`` raise StreamTooLong (every way
    of reading it: bytes, lines, events), so that nothing past the cap is buffered."""
    response.stream = _CappedStream(response.stream, max_bytes)  # type: ignore[arg-type]


class UpstreamClient:
    """One upstream: its URL, key, timeouts and retries, for both the async answer path
    and the blocking calls (the start check, the pack download; run those in a worker
    thread from the app). The async connection pool opens on first use; ``aclose`` it."""

    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None,
                 connect_timeout: float = 5.0, read_timeout: float = 120.0,
                 connect_retries: int = 3, sampling: Mapping[str, float | bool] | None = None,
                 answer_seconds: float = ANSWER_SECONDS) -> None:
        """``sampling``: fields sent with every answer request besides max_tokens and
        temperature (the config's ``upstream_sampling``: the repetition guard's);
        ``answer_seconds``: the deadline of one answer, however steadily it streams."""
        self.base_url = base_url.strip().rstrip("/")  # as given: error messages name it
        self.model = model
        self.sampling = dict(sampling or {})
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.connect_retries = connect_retries
        self.answer_seconds = answer_seconds
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._async: httpx.AsyncClient | None = None

    def _options(self, timeout: float | None) -> dict[str, Any]:
        """What every httpx client to this upstream is made with (``timeout``: one bound
        for every step instead of the client's own)."""
        return {"base_url": api_root(self.base_url), "headers": self._headers,
                "timeout": httpx.Timeout(self.read_timeout, connect=self.connect_timeout)
                if timeout is None else httpx.Timeout(timeout)}

    @property
    def _http(self) -> httpx.AsyncClient:
        if self._async is None:
            self._async = httpx.AsyncClient(
                transport=httpx.AsyncHTTPTransport(retries=self.connect_retries),
                **self._options(None))
        return self._async

    def _blocking(self, timeout: float | None = None,
                  retries: int | None = None) -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(
            retries=self.connect_retries if retries is None else retries),
            **self._options(timeout))

    async def aclose(self) -> None:
        if self._async is not None:
            await self._async.aclose()
            self._async = None

    async def __aenter__(self) -> "UpstreamClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # errors -------------------------------------------------------------------------
    def _unreachable(self, exc: httpx.TransportError) -> UpstreamUnavailableError:
        return UpstreamUnavailableError(
            f"cannot reach the upstream at {self.base_url} ({describe(exc)})",
            public="the upstream cannot be reached")

    def deadline(self) -> float:
        """When an answer asked for now must have ended (the event loop's clock)."""
        return asyncio.get_running_loop().time() + self.answer_seconds

    @asynccontextmanager
    async def in_time(self, deadline: float) -> AsyncIterator[None]:
        """The block, cancelled at ``deadline`` with an UpstreamUnavailableError."""
        try:
            async with asyncio.timeout_at(deadline):
                yield
        except TimeoutError:
            told = (f"the upstream's answer took longer than {self.answer_seconds:.0f} s (the "
                    "deadline of one answer); it was cut off")
            raise UpstreamUnavailableError(told, public=told) from None

    def _raise_for_status(self, response: httpx.Response) -> None:
        """A 4xx is final (UpstreamRejectedError, the server's message); a 429 or 5xx
        means try again later. A streamed ``response`` must have been read."""
        status = response.status_code
        if status < 400:
            return
        message = error_message(response)
        if status != 429 and status < 500:
            raise UpstreamRejectedError(message, status)
        raise UpstreamUnavailableError(
            f"the upstream at {self.base_url} answered {status}: {message}", status)

    # blocking calls -----------------------------------------------------------------
    def served_models(self, timeout: float | None = None,
                      retries: int | None = None) -> list[str]:
        """``GET /v1/models``: the ids of the models the upstream serves, in its order."""
        not_a_list = (f"the upstream at {self.base_url} did not answer GET {MODELS} with a "
                      "model list; is it an OpenAI-compatible server?")
        try:
            with self._blocking(timeout, retries) as http, http.stream("GET", MODELS) as response:
                self._raise_for_status_streamed(response)
                body = read_capped(response, MAX_MODEL_LIST_BYTES)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        try:
            ids = [entry["id"] for entry in json.loads(body)["data"]] if body is not None else 0
        except (ValueError, KeyError, TypeError, RecursionError):
            ids = 0
        if not isinstance(ids, list) or not all(
                isinstance(i, str) and 0 < len(i) <= MAX_MODEL_ID_CHARS for i in ids):
            raise UpstreamRejectedError(not_a_list, response.status_code, public=(
                f"the upstream did not answer GET {MODELS} with a model list"))
        return ids

    def check(self, timeout: float = 10.0) -> str:
        """The check before the first question: return the model to ask for (``model``, or
        the first the server lists) and keep it. Every failure is one line naming the URL:
        unreachable, the key refused, or the model not served (with the models it serves)."""
        url = self.base_url
        try:
            served = self.served_models(timeout, retries=1)
        except UpstreamRejectedError as exc:
            if exc.status in (401, 403):
                raise UpstreamRejectedError(
                    f"the upstream at {url} refused the API key ({exc.status}: {exc}); pass "
                    "--api-key, or set upstream_api_key or OPENAI_API_KEY", exc.status) from None
            if exc.status < 400:  # not a model list: the message says so
                raise
            raise UpstreamRejectedError(f"the upstream at {url} answered GET {MODELS} with "
                                        f"{exc.status}: {exc}", exc.status) from None
        except UpstreamUnavailableError as exc:
            if exc.status is not None:  # a 429 or 5xx
                raise
            raise UpstreamUnavailableError(f"{exc}; is it running?") from None
        if self.model is not None and self.model not in served:
            raise UpstreamRejectedError(
                f"the upstream at {url} does not serve the model {self.model!r}; it serves: "
                f"{', '.join(served) or 'none'} (choose with --model or upstream_model)", 404)
        if not served:
            raise UpstreamRejectedError(f"the upstream at {url} serves no model", 404)
        self.model = self.model or served[0]
        return self.model

    @contextmanager
    def stream(self, path: str, headers: dict[str, str] | None = None
               ) -> Iterator[httpx.Response]:
        """``GET path`` with its body still to read (e.g. ``iter_bytes``) in the block.
        A 4xx or 5xx raises before the block; a connection that breaks during it raises
        UpstreamUnavailableError (what was read so far stays read)."""
        try:
            with self._blocking() as http, http.stream("GET", path, headers=headers) as response:
                self._raise_for_status_streamed(response)
                try:
                    yield response
                except httpx.TransportError as exc:
                    raise UpstreamUnavailableError(
                        f"the connection to the upstream at {self.base_url} broke "
                        f"({describe(exc)})") from None
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None

    def _raise_for_status_streamed(self, response: httpx.Response) -> None:
        """A 4xx or 5xx raises, with the start of its body as the reason."""
        if response.status_code >= 400:
            body = read_capped(response, MAX_ERROR_BYTES) or b""
            self._raise_for_status(httpx.Response(response.status_code, content=body,
                                                  headers={"content-type": response.headers.get(
                                                      "content-type", "")},
                                                  request=response.request))

    def small_json(self, path: str, max_bytes: int) -> Any:
        """``GET path`` answered with JSON of at most ``max_bytes``; None when the upstream
        has no such resource (404). Anything else odd is UpstreamRejectedError."""
        try:
            with self._blocking() as http, http.stream("GET", path) as response:
                if response.status_code == 404:
                    return None
                self._raise_for_status_streamed(response)
                body = read_capped(response, max_bytes)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        try:
            return json.loads(body) if body is not None else json.loads("not JSON")
        except (ValueError, RecursionError):
            raise UpstreamRejectedError(f"the upstream at {self.base_url} answered GET {path} "
                                        f"with something other than JSON of at most "
                                        f"{max_bytes} bytes", response.status_code) from None

    # the answer path ----------------------------------------------------------------
    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """The response with at most MAX_ERROR_BYTES of its body read (a schema's answer
        is a few hundred bytes; a longer one is cut, and fails to parse)."""
        try:
            async with self._http.stream(method, path, **kwargs) as streamed:
                response = await _bounded(streamed)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        self._raise_for_status(response)
        return response

    async def model_name(self) -> str:
        """The model asked for: the one given, or the first the upstream serves."""
        if self.model is None:
            models = await asyncio.to_thread(self.served_models)
            if not models:
                raise UpstreamRejectedError("the upstream serves no model; start it with one "
                                            "(meancache upstream serve --model ...)", 404)
            self.model = models[0]
        return self.model

    async def stream_chat(self, messages: list[dict[str, str]],
                          max_tokens: int = DEFAULT_MAX_TOKENS,
                          temperature: float = DEFAULT_TEMPERATURE,
                          modules: Sequence[int] = ()) -> AsyncIterator[Delta | Completed]:
        """Yield the answer as it arrives, then one Completed with usage and timing.
        ``modules``: the indices of messages that recur (shared.pml.marks), which a
        meancache upstream keeps as modules; any other upstream ignores the mark.

        A stream that breaks midway raises; it is never restarted.
        """
        body = {"model": await self.model_name(), "messages": messages, "stream": True,
                **self.sampling, "max_tokens": max_tokens, "temperature": temperature,
                "stream_options": {"include_usage": True}}
        start, deadline, caps = time.perf_counter(), self.deadline(), AnswerCaps(max_tokens)
        try:
            async with contextlib.AsyncExitStack() as stack:
                async with self.in_time(deadline):
                    source = await stack.enter_async_context(aconnect_sse(
                        self._http, "POST", "/v1/chat/completions", json=body,
                        headers=marks(modules)))
                    if source.response.status_code >= 400:
                        self._raise_for_status(await _bounded(source.response))
                cap_stream(source.response, caps.stream_bytes)
                async for event in self._read_stream(source, start, deadline, caps):
                    yield event
        except httpx.TransportError as exc:  # _read_stream reports failures once streaming
            raise self._unreachable(exc) from None

    async def _read_stream(self, source: EventSource, start: float, deadline: float,
                           caps: AnswerCaps) -> AsyncIterator[Delta | Completed]:
        """The events of an answer, each checked: the upstream's JSON is untrusted input.
        Past ``caps`` the answer ends there, cut; past ``deadline`` it raises."""
        text, ttft, finish, usage, cut = "", None, None, {}, None
        pieces = size = 0
        events = source.aiter_sse()
        try:
            while cut is None:
                async with self.in_time(deadline):
                    sse = await anext(events, None)
                if sse is None or sse.data == "[DONE]":
                    break
                chunk = _object(sse.data)
                if "error" in chunk:
                    error = chunk["error"]
                    message = error.get("message") if isinstance(error, dict) else error
                    raise UpstreamUnavailableError(
                        f"the upstream failed mid-answer: {str(message)[:200]}",
                        public="the upstream failed mid-answer")
                usage = _field(chunk, "usage", dict) or usage
                for choice in _field(chunk, "choices", list) or []:
                    choice = choice if isinstance(choice, dict) else {}
                    piece = _field(_field(choice, "delta", dict) or {}, "content", str) or ""
                    finish = _field(choice, "finish_reason", str) or finish
                    if piece:
                        pieces, size = pieces + 1, size + len(piece.encode())
                        cut = caps.past(pieces, size)
                        if cut is not None:
                            break
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        text += piece
                        yield Delta(piece)
        except StreamTooLong:
            cut = caps.too_long()
        except SSEError as exc:  # e.g. a server that ignores "stream": true
            raise UpstreamUnavailableError(
                f"the upstream did not answer with an event stream ({exc})",
                public="the upstream did not answer with an event stream") from None
        except httpx.TransportError as exc:
            raise UpstreamUnavailableError(
                f"the connection to the upstream broke mid-answer ({describe(exc)})",
                public="the connection to the upstream broke mid-answer") from None
        finally:
            await events.aclose()
        details = _field(usage, "prompt_tokens_details", dict) or {}
        yield Completed(
            text, _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens")),
            _count(details.get("cached_tokens")) or 0,
            ttft if ttft is not None else time.perf_counter() - start,
            "length" if cut else finish, cut,
        )

    # the proxy's pass-through -------------------------------------------------------
    @asynccontextmanager
    async def relay_chat(self, body: bytes, max_bytes: int, modules: Sequence[int] = ()
                         ) -> AsyncIterator[httpx.Response]:
        """POST an app's own chat request (``body`` as it sent it: the proxy's requests the
        cache must not answer) with this client's key, ``modules`` marked as in
        :meth:`stream_chat`; the response is open in the block, its body still to read,
        reading past ``max_bytes`` of it raising StreamTooLong. A 4xx or 5xx raises before
        the block, as every call here."""
        try:
            async with self._http.stream("POST", "/v1/chat/completions", content=body,
                                         headers={"Content-Type": "application/json",
                                                  **marks(modules)}) as response:
                if response.status_code >= 400:
                    self._raise_for_status(await _bounded(response))
                cap_stream(response, max_bytes)
                yield response
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None


MAX_ERROR_BYTES = 64 * 1024  # of an upstream's error body: its message is all that is read


def marks(modules: Sequence[int]) -> dict[str, str]:
    """The header that marks ``modules`` (none when there are none)."""
    return {MODULES_HEADER: write_marks(modules)} if modules else {}


async def _bounded(response: httpx.Response) -> httpx.Response:
    """A streamed error response with at most MAX_ERROR_BYTES of its body read."""
    data = b""
    async for chunk in response.aiter_bytes():
        data += chunk
        if len(data) >= MAX_ERROR_BYTES:
            break
    return httpx.Response(response.status_code, headers=response.headers,
                          content=data[:MAX_ERROR_BYTES], request=response.request)


def _object(data: str) -> dict[str, Any]:
    """One streamed event's JSON object."""
    try:
        chunk = json.loads(data)
    except ValueError:
        chunk = None
    if not isinstance(chunk, dict):
        raise UpstreamUnavailableError(
            f"the upstream sent an event that is not a JSON object: {data[:80]!r}",
            public="the upstream sent an event that is not a JSON object")
    return chunk


def _field(record: dict[str, Any], name: str, kind: type) -> Any:
    """``record[name]`` if it is a ``kind``, else None (an upstream's JSON is untrusted)."""
    value = record.get(name)
    return value if isinstance(value, kind) else None


def _count(value: object) -> int | None:
    """A token count as the upstream sent it, or None when it is not a count."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 \
        else None

def read_capped(response: httpx.Response, max_bytes: int) -> bytes | None:
    """The body, or None once it passes ``max_bytes`` (never buffered beyond that)."""
    declared = response.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        return None
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > max_bytes:
            return None
    return bytes(body)
