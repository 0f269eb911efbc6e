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

ROLES = ("system", "user", "assistant")
MAX_MODEL_CHARS = 128  # a model id's length

# Beyond OpenAI's API (send them with the SDK's extra_body): the repetition guard, named as
# vLLM names its penalty; a request that leaves them out gets the server's defaults.
EXTENSIONS = {"repetition_penalty": float, "repetition_window": int, "stop_on_loops": bool}

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
    body = {name: value for name, value in body.items() if value is not None}  # null: unset
    model = body.get("model", served_model)
    if not isinstance(model, str):
        raise BadRequest("'model' must be a string", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise BadRequest(f"'model' has {len(model)} characters; a model id has at most "
                         f"{MAX_MODEL_CHARS}", "model")
    if model != served_model:
        raise UnknownModelError(f"the model {excerpt(model)} does not exist here; this server "
                                f"serves {served_model!r} (GET /v1/models lists it)", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list")
    clean: list[dict[str, str]] = []
    for i, message in enumerate(messages):
        if not isinstance(message, dict) or message.get("role") not in ROLES:
            raise BadRequest(f"messages[{i}] needs a 'role' of {', '.join(ROLES)}")
        content = message.get("content")
        if isinstance(content, list):  # the structured form: a list of text parts
            if not all(isinstance(p, dict) and p.get("type") == "text" for p in content):
                raise BadRequest(f"messages[{i}].content: only text parts are supported; send "
                                 "the content as a string or a list of text parts")
            content = "".join(str(p.get("text", "")) for p in content)
        if not isinstance(content, str):
            raise BadRequest(f"messages[{i}].content must be a string")
        clean.append({"role": message["role"], "content": content})
    stop = body.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, list | tuple) or not all(isinstance(s, str) for s in stop):
        raise BadRequest("'stop' must be a string or a list of strings")
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens", defaults.max_tokens))
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("'stream_options' must be an object", "stream_options")
    try:
        params = replace(
            defaults,
            max_tokens=_number(max_tokens, "max_tokens", int),
            temperature=_number(body.get("temperature", 1.0), "temperature", float),
            top_p=_number(body.get("top_p", 1.0), "top_p", float),
            stop=tuple(stop),
            seed=None if body.get("seed") is None else _number(body["seed"], "seed", int),
            frequency_penalty=_number(body.get("frequency_penalty", 0.0), "frequency_penalty",
                                      float),
            presence_penalty=_number(body.get("presence_penalty", 0.0), "presence_penalty",
                                     float),
            **{name: _extension(body, name, getattr(defaults, name)) for name in EXTENSIONS},
        )
    except ValueError as exc:
        raise BadRequest(str(exc)) from None
    stream = body.get("stream", False)
    if not isinstance(stream, bool):  # "false" is a non-empty string, not false
        raise BadRequest("'stream' must be true or false", "stream")
    return ChatRequest(clean, params, stream,
                       bool(options.get("include_usage")))


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


def _number(value: Any, name: str, kind: type) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float) or (
        kind is int and not float(value).is_integer()
    ):
        raise BadRequest(f"'{name}' must be a number" + (" (an integer)" if kind is int else ""))
    return kind(value)


def _extension(body: dict[str, Any], name: str, default: Any) -> Any:
    """An extension field's value, or the server's default when it is left out."""
    if name not in body:
        return default
    kind = EXTENSIONS[name]
    if kind is bool:
        if not isinstance(body[name], bool):
            raise BadRequest(f"'{name}' must be true or false", name)
        return body[name]
    return _number(body[name], name, kind)


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

