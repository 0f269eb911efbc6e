"""Talking to the upstream: any OpenAI-compatible server, plus meancache's PML schemas.

A base URL is taken with or without its ``/v1`` (``http://host:8080`` and
``http://host:8080/v1/`` name the same server), as OpenAI clients take ``OPENAI_BASE_URL``.

Streams chat completions over SSE (httpx-sse). Only the connection is retried (httpx's
transport retries, with backoff): nothing has been sent then, so an answer is never
restarted. Every transport or HTTP failure becomes an UpstreamRequestError subclass with a
message for the user.
"""

import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from httpx_sse import EventSource, SSEError, aconnect_sse
from meancache.client.errors import UpstreamRejectedError, UpstreamUnavailableError
from meancache.client.http_errors import describe, error_message
from meancache.shared.pml import PML_MEDIA_TYPE


def api_root(url: str) -> str:
    """The server's root: ``url`` without trailing slashes and without a final ``/v1``."""
    root = url.strip().rstrip("/")
    return root.removesuffix("/v1").rstrip("/")


def check_upstream(url: str, api_key: str | None, model: str | None,
                   timeout: float = 10.0) -> str:
    """Ask ``GET /v1/models`` before the first question; return the model to ask for
    (``model``, or the first the server lists). Every failure is one line naming ``url``:
    unreachable, the key refused, or the model not served (with the models it serves)."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(timeout=timeout, headers=headers,
                          transport=httpx.HTTPTransport(retries=1)) as http:
            response = http.get(f"{api_root(url)}/v1/models")
    except httpx.TransportError as exc:
        raise UpstreamUnavailableError(
            f"cannot reach the upstream at {url} ({describe(exc)}); is it running?") from None
    status = response.status_code
    if status in (401, 403):
        raise UpstreamRejectedError(
            f"the upstream at {url} refused the API key ({status}: {error_message(response)}); "
            "pass --api-key, or set upstream_api_key or OPENAI_API_KEY", status)
    if status >= 400:
        message = (f"the upstream at {url} answered GET /v1/models with {status}: "
                   f"{error_message(response)}")
        if status == 429 or status >= 500:
            raise UpstreamUnavailableError(message)
        raise UpstreamRejectedError(message, status)
    try:
        served = [str(entry["id"]) for entry in response.json()["data"]]
    except (ValueError, KeyError, TypeError):
        raise UpstreamRejectedError(
            f"the upstream at {url} did not answer GET /v1/models with a model list; is it "
            "an OpenAI-compatible server?", status) from None
    if model is not None and model not in served:
        raise UpstreamRejectedError(
            f"the upstream at {url} does not serve the model {model!r}; it serves: "
            f"{', '.join(served) or 'none'} (choose with --model or upstream_model)", 404)
    if not served:
        raise UpstreamRejectedError(f"the upstream at {url} serves no model", 404)
    return model or served[0]


@dataclass(frozen=True)
class Delta:
    text: str


@dataclass(frozen=True)
class Completed:
    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int  # prompt tokens the upstream reused from Prompt Cache modules
    ttft_seconds: float  # as this client saw it
    finish_reason: str | None


class UpstreamClient:
    def __init__(self, base_url: str, api_key: str | None = None, model: str | None = None,
                 connect_timeout: float = 5.0, read_timeout: float = 120.0,
                 connect_retries: int = 3) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.strip().rstrip("/")  # as given: error messages name it
        self.model = model
        self._http = httpx.AsyncClient(
            base_url=api_root(base_url), headers=headers,
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
            transport=httpx.AsyncHTTPTransport(retries=connect_retries),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "UpstreamClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # requests -----------------------------------------------------------------------
    def _unreachable(self, exc: httpx.TransportError) -> UpstreamUnavailableError:
        return UpstreamUnavailableError(
            f"cannot reach the upstream at {self.base_url} ({describe(exc)})")

    @staticmethod
    async def _check(response: httpx.Response) -> None:
        """A 4xx is final (UpstreamRejectedError); a 429 or 5xx means try again later."""
        if response.status_code < 400:
            return
        await response.aread()
        message = error_message(response)
        if response.status_code != 429 and response.status_code < 500:
            raise UpstreamRejectedError(message, response.status_code)
        raise UpstreamUnavailableError(
            f"the upstream answered {response.status_code}: {message}")

    async def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        try:
            response = await self._http.request(method, path, **kwargs)
        except httpx.TransportError as exc:
            raise self._unreachable(exc) from None
        await self._check(response)
        return response

    async def model_name(self) -> str:
        if self.model is None:
            models = (await self._send("GET", "/v1/models")).json().get("data") or []
            if not models:
                raise UpstreamRejectedError("the upstream serves no model; start it with one "
                                            "(meancache upstream serve --model ...)", 404)
            self.model = str(models[0]["id"])
        return self.model

    async def add_schema(self, pml: str) -> dict[str, Any]:
        """Register a PML schema (meancache upstreams only)."""
        response = await self._send("POST", "/v1/schemas", content=pml.encode(),
                                    headers={"Content-Type": PML_MEDIA_TYPE})
        return dict(response.json())

    async def stream_chat(self, messages: list[dict[str, str]], max_tokens: int = 512,
                          temperature: float = 0.7) -> AsyncIterator[Delta | Completed]:
        """Yield the answer as it arrives, then one Completed with usage and timing.

        A stream that breaks midway raises; it is never restarted.
        """
        body = {"model": await self.model_name(), "messages": messages, "stream": True,
                "max_tokens": max_tokens, "temperature": temperature,
                "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        try:
            async with aconnect_sse(self._http, "POST", "/v1/chat/completions",
                                    json=body) as source:
                await self._check(source.response)
                async for event in self._read_stream(source, start):
                    yield event
        except httpx.TransportError as exc:  # _read_stream reports failures once streaming
            raise self._unreachable(exc) from None

    async def _read_stream(self, source: EventSource, start: float
                           ) -> AsyncIterator[Delta | Completed]:
        text, ttft, finish, usage = "", None, None, {}
        try:
            async for sse in source.aiter_sse():
                if sse.data == "[DONE]":
                    break
                chunk = sse.json()
                if "error" in chunk:
                    raise UpstreamUnavailableError(
                        f"the upstream failed mid-answer: {chunk['error'].get('message')}")
                usage = chunk.get("usage") or usage
                for choice in chunk.get("choices") or []:
                    piece = (choice.get("delta") or {}).get("content") or ""
                    finish = choice.get("finish_reason") or finish
                    if piece:
                        if ttft is None:
                            ttft = time.perf_counter() - start
                        text += piece
                        yield Delta(piece)
        except SSEError as exc:  # e.g. a server that ignores "stream": true
            raise UpstreamUnavailableError(
                f"the upstream did not answer with an event stream ({exc})") from None
        except httpx.TransportError as exc:
            raise UpstreamUnavailableError(
                f"the connection to the upstream broke mid-answer ({describe(exc)})"
            ) from None
        details = usage.get("prompt_tokens_details") or {}
        yield Completed(
            text, usage.get("prompt_tokens"), usage.get("completion_tokens"),
            int(details.get("cached_tokens") or 0),
            ttft if ttft is not None else time.perf_counter() - start, finish,
        )
