"""The OpenAI Chat Completions wire format as the proxy reads and writes it: request
bodies validated by pydantic (strict JSON types, OpenAI's ranges; fields the proxy does
not interpret are kept, for the upstream), and the completion, chunk and error objects it
answers with. Every answer carries a ``meancache`` field (clients ignore unknown fields)
and the ``x-meancache`` header saying where it came from."""

import time
from collections.abc import Sequence
from typing import Annotated, Any, Literal, TypeVar
from urllib.parse import quote

from meancache.client.cache import CacheStats
from meancache.client.chat.conversations import Turn
from meancache.client.errors import ProxyRequestError
from meancache.shared.errors import excerpt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

MAX_MESSAGES = 256  # in one request
MAX_MODEL_CHARS = 256
HEADER = "x-meancache"
FINISH_REASONS = ("stop", "length", "content_filter", "tool_calls", "function_call")

_REQUEST = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)


class ContentPart(BaseModel):
    """One part of a structured ``content``: text, or what the cache cannot match (an
    image, audio)."""

    model_config = _REQUEST
    type: str = Field(min_length=1, max_length=64)
    text: str | None = None


class Message(BaseModel):
    model_config = _REQUEST
    role: Literal["system", "developer", "user", "assistant", "tool", "function"]
    content: str | list[ContentPart] | None = None

    def text(self) -> str | None:
        """The content as text; None when it holds anything but text (or nothing)."""
        if isinstance(self.content, str):
            return self.content
        if not self.content or any(p.type != "text" or p.text is None for p in self.content):
            return None
        return "".join(p.text or "" for p in self.content)


class StreamOptions(BaseModel):
    model_config = _REQUEST
    include_usage: bool | None = None


class ChatRequest(BaseModel):
    """``POST /v1/chat/completions``: what the proxy reads of it (the rest is kept in
    ``model_extra`` and decides whether the cache may answer)."""

    model_config = _REQUEST
    model: str = Field(min_length=1, max_length=MAX_MODEL_CHARS)
    messages: list[Message] = Field(min_length=1, max_length=MAX_MESSAGES)
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] | None = None
    n: Annotated[int, Field(ge=1, le=128)] | None = None

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


Body = TypeVar("Body", bound=BaseModel)


# what the upstream answers a relayed request with: checked before it is relayed --------
_ANSWER = ConfigDict(extra="allow", strict=True, allow_inf_nan=False)
Count = Annotated[int, Field(ge=0)]


class UpstreamUsage(BaseModel):
    model_config = _ANSWER
    prompt_tokens: Count
    completion_tokens: Count
    total_tokens: Count | None = None


class UpstreamMessage(BaseModel):
    """A whole answer's message, or a streamed chunk's delta."""

    model_config = _ANSWER
    role: str | None = None
    content: str | None = None


class UpstreamChoice(BaseModel):
    model_config = _ANSWER
    index: Count = 0
    message: UpstreamMessage
    finish_reason: str | None = None


class UpstreamCompletion(BaseModel):
    """A whole chat completion, as OpenAI's API defines it (fields not read kept)."""

    model_config = _ANSWER
    choices: list[UpstreamChoice] = Field(min_length=1)
    usage: UpstreamUsage | None = None


class UpstreamChunkChoice(BaseModel):
    model_config = _ANSWER
    index: Count = 0
    delta: UpstreamMessage
    finish_reason: str | None = None


class UpstreamChunk(BaseModel):
    """One event of a streamed chat completion."""

    model_config = _ANSWER
    choices: list[UpstreamChunkChoice]
    usage: UpstreamUsage | None = None


def checked_answer(model: type[Body], answer: object) -> Body | str:
    """``answer`` as ``model``, or where it first is not (a field's place, never its value:
    the upstream's text does not reach the app)."""
    try:
        return model.model_validate(answer)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in error["loc"])[:100] or "the answer"
        return f"{where}: {error['msg']}"


class FeedbackRequest(BaseModel):
    """``POST /v1/meancache/feedback``: the response whose answer was wrong."""

    model_config = ConfigDict(extra="forbid", strict=True)
    id: str = Field(min_length=1, max_length=128)
    wrong: Literal[True] = True  # the one feedback there is: "wrong answer"


def parse(model: type[Body], body: bytes) -> Body:
    """``body`` as ``model``, or a 400 naming the first field at fault."""
    try:
        return model.model_validate_json(body)
    except ValidationError as exc:
        error = exc.errors(include_url=False, include_input=False)[0]
        where = ".".join(str(part) for part in error["loc"])
        raise ProxyRequestError(400, f"{excerpt(where) + ': ' if where else ''}{error['msg']}",
                                param=where[:64] or None) from None


# answers ----------------------------------------------------------------------------
def usage(turn: Turn) -> dict[str, Any]:
    """What the upstream computed for this answer: nothing for an answer from a cache."""
    if turn.source.from_cache:
        prompt, completion, cached = 0, 0, 0
    else:
        prompt, completion = turn.prompt_tokens or 0, turn.completion_tokens or 0
        cached = turn.cached_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion,
            "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def provenance(turn: Turn) -> dict[str, Any]:
    """The ``meancache`` field: where the answer came from (and ``cut``: why the proxy cut
    the upstream's answer short, when it did; ``declined``: the near match the cache did
    not serve, and why: refused, or checked against this fresh answer by exploration)."""
    found = {"source": str(turn.source), "similarity": turn.similarity,
             "matched_query": turn.matched_query}
    if turn.declined:
        found["declined"] = turn.declined
    return found | {"cut": turn.cut} if turn.cut else found


def header(turn: Turn | None, bypass: str | None = None) -> dict[str, str]:
    """The ``x-meancache`` header: ``hit; similarity=0.93; matched=<the stored question,
    percent-encoded>; source=cache``, ``miss``, or ``bypass; reason=...``."""
    if turn is None:
        return {HEADER: f"bypass; reason={bypass}"}
    if not turn.source.from_cache:
        return {HEADER: "miss"}
    matched = quote((turn.matched_query or "")[:200], safe=" ,.?!'()-_:/")
    return {HEADER: f"hit; similarity={turn.similarity or 0.0:.4f}; matched={matched}; "
                    f"source={turn.source}"}


def finish_reason(turn: Turn) -> str:
    """The upstream's reason if it is one of OpenAI's (its answer is untrusted)."""
    return turn.finish_reason if turn.finish_reason in FINISH_REASONS else "stop"


class Completion:
    """The response objects of one answer, whole or streamed."""

    def __init__(self, response_id: str, model: str) -> None:
        self.id = response_id
        self.model = model
        self.created = int(time.time())

    def _head(self, kind: str) -> dict[str, Any]:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def whole(self, turn: Turn) -> dict[str, Any]:
        return self._head("chat.completion") | {
            "choices": [{"index": 0, "message": {"role": "assistant", "content": turn.answer},
                         "finish_reason": finish_reason(turn)}],
            "usage": usage(turn), "meancache": provenance(turn)}

    def chunk(self, delta: dict[str, str], turn: Turn | None = None) -> dict[str, Any]:
        chunk = self._head("chat.completion.chunk") | {"choices": [{
            "index": 0, "delta": delta,
            "finish_reason": None if turn is None else finish_reason(turn)}]}
        if turn is not None:
            chunk["meancache"] = provenance(turn)
        return chunk

    def usage_chunk(self, turn: Turn) -> dict[str, Any]:
        return self._head("chat.completion.chunk") | {"choices": [], "usage": usage(turn)}


def model_list(models: Sequence[str]) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": name, "object": "model", "created": 0,
                                        "owned_by": "upstream"} for name in models]}


def stats_body(caches: Sequence[tuple[str, CacheStats]]) -> dict[str, Any]:
    """``GET /v1/meancache/stats``: the app's caches (one per set of system messages), each
    with its hit rate and, beside it, the learned estimate of its wrong rate with the
    upper confidence limit the bound rests on; and the hit rate over all of them."""
    hits = sum(stats.hits for _, stats in caches)
    misses = sum(stats.misses for _, stats in caches)
    return {"object": "meancache.stats",
            "hits": hits, "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
            "caches": [{"id": pid, "entries": stats.entries, "hits": stats.hits,
                        "misses": stats.misses, "explored": stats.explored,
                        "hit_rate": stats.hit_rate, "wrong_rate": stats.wrong_rate,
                        "wrong_rate_upper": stats.wrong_rate_upper,
                        "wrong_rate_labels": stats.wrong_rate_labels,
                        "wrong_rate_pooled": stats.wrong_rate_pooled,
                        "max_wrong_rate": stats.max_wrong_rate,
                        "wrong_rate_needs": stats.wrong_rate_needs,
                        "wrong_rate_lower": stats.wrong_rate_lower,
                        "serves_from": stats.serves_from, "closed": stats.closed,
                        "learns_from_answers": stats.learns_from_answers,
                        "warmup": stats.warmup, "checked": stats.checked,
                        "checked_wrong": stats.checked_wrong,
                        "checked_within": stats.checked_within,
                        "rejections": stats.rejections} for pid, stats in caches]}
