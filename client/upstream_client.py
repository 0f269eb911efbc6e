"""Talking to the upstream: any OpenAI-compatible server, plus meancache's PML schemas.

Streams chat completions over SSE, retries with exponential backoff while nothing has
been received yet (a half-streamed answer is never silently restarted), and turns every
transport or HTTP failure into an UpstreamRequestError subclass with a message for the user.
"""

import asyncio
import json
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
from meancache.client.errors import UpstreamRejectedError, UpstreamUnavailableError
from meancache.client.http_errors import describe, error_message

log = logging.getLogger(__name__)


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
                 retries: int = 3, backoff_seconds: float = 0.5) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self._http = httpx.AsyncClient(
            base_url=self.base_url, headers=headers,
            timeout=httpx.Timeout(read_timeout, connect=connect_timeout),
        )

    async def aclose(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> "UpstreamClient":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # requests -----------------------------------------------------------------------
    async def _send(self, method: str, path: str, stream: bool = False, **kwargs: Any
                    ) -> httpx.Response:
        """Send with retries on transport errors, 429 and 5xx; a 4xx is final."""
        failure = ""
        for attempt in range(self.retries + 1):
            if attempt:
                delay = self.backoff_seconds * 2 ** (attempt - 1)
                log.warning("%s; retrying in %.1fs", failure, delay)
                await asyncio.sleep(delay)
            request = self._http.build_request(method, path, **kwargs)
            try:
                response = await self._http.send(request, stream=stream)
            except httpx.TransportError as exc:
                failure = f"cannot reach the upstream at {self.base_url} ({describe(exc)})"
                continue
            if response.status_code < 400:
                return response
            await response.aread()
            await response.aclose()
            message = error_message(response)
            if response.status_code != 429 and response.status_code < 500:
                raise UpstreamRejectedError(message, response.status_code)
            failure = f"the upstream answered {response.status_code}: {message}"
        raise UpstreamUnavailableError(failure)

    async def model_name(self) -> str:
        if self.model is None:
            models = (await self._send("GET", "/v1/models")).json().get("data") or []
            if not models:
                raise UpstreamRejectedError("the upstream serves no model", 404)
            self.model = str(models[0]["id"])
        return self.model

    async def add_schema(self, pml: str) -> dict[str, Any]:
        """Register a PML schema (meancache upstreams only)."""
        response = await self._send("POST", "/v1/schemas", content=pml.encode(),
                                    headers={"Content-Type": "text/plain"})
        return dict(response.json())

    async def stream_chat(self, messages: list[dict[str, str]], max_tokens: int = 512,
                          temperature: float = 0.7) -> AsyncIterator[Delta | Completed]:
        """Yield the answer as it arrives, then one Completed with usage and timing.

        Retries happen only before the answer starts; a stream that breaks midway raises.
        """
        body = {"model": await self.model_name(), "messages": messages, "stream": True,
                "max_tokens": max_tokens, "temperature": temperature,
                "stream_options": {"include_usage": True}}
        start = time.perf_counter()
        response = await self._send("POST", "/v1/chat/completions", stream=True, json=body)
        try:
            async for event in self._read_stream(response, start):
                yield event
        finally:
            await response.aclose()

    async def _read_stream(self, response: httpx.Response, start: float
                           ) -> AsyncIterator[Delta | Completed]:
        text, ttft, finish, usage = "", None, None, {}
        try:
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                payload = line.removeprefix("data:").strip()
                if payload == "[DONE]":
                    break
                chunk = json.loads(payload)
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
