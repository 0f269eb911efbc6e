"""The OpenAI chat-completions wire format: request validation and response objects.

Every request field of the API (the ``CompletionCreateParams`` of the official ``openai``
client, 3.54) is in exactly one of :data:`HONOURED`, :data:`LABELS` and
:data:`UNSUPPORTED`; a field in none of them is refused by name, so nothing a client
asks for is ignored in silence.
"""

import json
import time
import uuid
from dataclasses import dataclass, replace
from typing import Any

from meancache.shared.errors import EXCERPT_CHARS, excerpt
from meancache.upstream.errors import BadRequest, UnknownModelError
from meancache.upstream.prompt_cache.engine import Finish
from meancache.upstream.sampling_params import SamplingParams
from meancache.upstream.server.request_models import ChatCompletionRequest
from pydantic import ValidationError

ROLES = ("system", "user", "assistant")
MAX_MODEL_CHARS = 128  # a model id's length

# Beyond OpenAI's API (send them with the SDK's extra_body): the repetition guard, named as
# vLLM names its penalty and llama.cpp its DRY; a request that leaves them out gets the
# server's defaults.
EXTENSIONS = ("repetition_penalty", "repetition_window", "stop_on_loops", "dry_multiplier",
              "dry_base", "dry_allowed_length")
_INTEGERS = frozenset({"max_tokens", "max_completion_tokens", "seed", "repetition_window",
                       "dry_allowed_length"})
_REALS = frozenset({"temperature", "top_p", "frequency_penalty", "presence_penalty",
                    "repetition_penalty", "dry_multiplier", "dry_base"})
_BOOLS = frozenset({"stream", "stop_on_loops"})

# Fields that shape the answer and are honoured as the API defines them; ``model`` may be
# left out (the served model answers).
HONOURED = frozenset({
    "messages", "model", "stream", "stream_options", "max_tokens", "max_completion_tokens",
    "temperature", "top_p", "stop", "seed", "frequency_penalty", "presence_penalty",
    *EXTENSIONS,
})
# Fields that only label a request for the caller's own bookkeeping and change nothing in
# the answer: accepted.
LABELS = frozenset({"user", "safety_identifier", "metadata", "prompt_cache_key"})
# Features this server lacks: refused with 400 naming the field, unless the value asks for
# nothing (null, or the API's default, listed here).
UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "n": (1,),  # one choice per request: send the request again for another sample
    "audio": (),
    "function_call": ("none",),
    "functions": ([],),
    "logit_bias": ({},),
    "logprobs": (False,),
    "top_logprobs": (0,),
    "modalities": (["text"],),
    "moderation": (),
    "parallel_tool_calls": (True,),
    "prediction": (),
    "prompt_cache_options": (),
    "prompt_cache_retention": (),
    "reasoning_effort": (),
    "response_format": ({"type": "text"},),
    "service_tier": ("auto", "default"),
    "store": (False,),
    "tool_choice": ("none",),
    "tools": ([],),
    "verbosity": (),
    "web_search_options": (),
}
STREAM_OPTIONS = {"include_usage": (True, False), "include_obfuscation": (False,)}


@dataclass(frozen=True)
class ChatRequest:
    messages: list[dict[str, str]]
    params: SamplingParams
    stream: bool
    include_usage: bool


def parse_chat_request(body: Any, defaults: SamplingParams, served_model: str) -> ChatRequest:
    """The request in ``body``; what it leaves out comes from ``defaults``."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    _refuse_unsupported(body)
    # null: unset; an unsupported field that asks for nothing (n=1) is dropped too.
    body = {name: value for name, value in body.items()
            if value is not None and name not in UNSUPPORTED}
    try:
        request = ChatCompletionRequest.model_validate(body)
    except ValidationError as exc:
        raise _bad_field(exc.errors()[0]) from None
    model = served_model if request.model is None else request.model
    if model != served_model:
        raise UnknownModelError(f"the model {excerpt(model)} does not exist here; this server "
                                f"serves {served_model!r} (GET /v1/models lists it)", "model")
    clean = [{"role": m.role, "content": m.text()} for m in request.messages]
    stop = request.stop or ()
    stop = (stop,) if isinstance(stop, str) else tuple(stop)

    def given(name: str, default: Any) -> Any:
        value = getattr(request, name)
        return default if value is None else value

    max_tokens = given("max_completion_tokens", given("max_tokens", defaults.max_tokens))
    try:
        params = replace(
            defaults, max_tokens=max_tokens, stop=stop, seed=request.seed,
            temperature=given("temperature", 1.0), top_p=given("top_p", 1.0),
            frequency_penalty=given("frequency_penalty", 0.0),
            presence_penalty=given("presence_penalty", 0.0),
            **{name: given(name, getattr(defaults, name)) for name in EXTENSIONS})
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    options = request.stream_options
    return ChatRequest(clean, params, bool(request.stream),
                       bool(options is not None and options.include_usage))


def _bad_field(error: Any) -> BadRequest:
    """A 400 for pydantic's first complaint, in this API's words, naming the field."""
    loc = [str(part) for part in error["loc"]]
    field = loc[0] if loc else ""
    param = ".".join(loc)[:EXCERPT_CHARS] or None
    if field == "messages":
        if len(loc) == 1:
            return BadRequest("'messages' must be a non-empty list", param)
        where = f"messages[{loc[1]}]"
        if len(loc) > 2 and loc[2] == "content":
            return BadRequest(f"{where}.content must be a string, or a list of text parts "
                              "({\"type\": \"text\", \"text\": ...})", param)
        return BadRequest(f"{where} needs a 'role' of {', '.join(ROLES)} and a 'content'",
                          param)
    if field in _INTEGERS and error["msg"].endswith("out of range"):
        return BadRequest(f"'{field}' is out of range", param)
    messages = {
        "model": f"'model' must be a string of at most {MAX_MODEL_CHARS} characters",
        "stop": "'stop' must be a string or a list of strings",
        "stream_options": "'stream_options' must be an object",
        "metadata": "'metadata' must be an object of strings",
    }
    if field in messages:
        return BadRequest(messages[field], param)
    if field in _INTEGERS:
        return BadRequest(f"'{field}' must be a number (an integer)", param)
    if field in _REALS:
        return BadRequest(f"'{field}' must be a number", param)
    if field in _BOOLS:
        return BadRequest(f"'{field}' must be true or false", param)
    return BadRequest(f"'{field}': {error['msg']}", param)


def _refuse_unsupported(body: dict[str, Any]) -> None:
    """A 400 naming the first field that asks for what this server cannot do."""
    for name, value in body.items():
        if name in UNSUPPORTED and value is not None and value not in UNSUPPORTED[name]:
            allowed = " or ".join(json.dumps(v) for v in UNSUPPORTED[name]) or "null"
            raise BadRequest(f"{name!r} = {json.dumps(value)[:80]} is not supported by this "
                             f"server; leave it out (or send {allowed})", name)
        if name not in HONOURED | LABELS | UNSUPPORTED.keys():
            raise BadRequest(f"unknown field {excerpt(name)}: it is not part of the "
                             "chat-completions API this server implements", name[:EXCERPT_CHARS])
    options = body.get("stream_options")
    for name, value in (options.items() if isinstance(options, dict) else ()):
        param = f"stream_options.{name}"
        if name not in STREAM_OPTIONS:
            raise BadRequest(f"unknown field {excerpt(param)}", param[:EXCERPT_CHARS])
        if value not in STREAM_OPTIONS[name]:
            raise BadRequest(f"{param!r} = {json.dumps(value)} is not supported by this server",
                             param)


def usage(finish: Finish) -> dict[str, Any]:
    return {
        "prompt_tokens": finish.prompt_tokens,
        "completion_tokens": finish.completion_tokens,
        "total_tokens": finish.prompt_tokens + finish.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": finish.cached_tokens},
    }


def finish_reason(finish: Finish) -> str:
    """OpenAI's reason: an answer ended by the loop stop ended on the server's terms."""
    return "stop" if finish.reason in ("stop", "loop", "cancelled") else "length"


class Completion:
    """Builds the response objects of one completion, streamed or whole."""

    def __init__(self, model: str) -> None:
        self.id = f"chatcmpl-{uuid.uuid4().hex}"
        self.created = int(time.time())
        self.model = model

    def whole(self, text: str, finish: Finish) -> dict[str, Any]:
        return {
            "id": self.id, "object": "chat.completion", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "finish_reason": finish_reason(finish)}],
            "usage": usage(finish),
            "meancache": {"ttft_ms": round(finish.ttft_seconds * 1000, 3)},
        }

    def chunk(self, delta: dict[str, str], finish: Finish | None = None) -> dict[str, Any]:
        chunk: dict[str, Any] = {
            "id": self.id, "object": "chat.completion.chunk", "created": self.created,
            "model": self.model,
            "choices": [{"index": 0, "delta": delta,
                         "finish_reason": finish_reason(finish) if finish else None}],
        }
        if finish is not None:
            chunk["meancache"] = {"ttft_ms": round(finish.ttft_seconds * 1000, 3),
                                  "cached_tokens": finish.cached_tokens}
        return chunk

    def usage_chunk(self, finish: Finish) -> dict[str, Any]:
        return {"id": self.id, "object": "chat.completion.chunk", "created": self.created,
                "model": self.model, "choices": [], "usage": usage(finish)}

