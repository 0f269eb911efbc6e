"""Which requests the cache may answer. A cached answer was given to a plain question
(after the same system messages, in a conversation the cache answered), so anything that
shapes the answer otherwise goes straight to the upstream and is not stored: tools and
function calls, images or audio, several choices (``n``), sampling or format options the
cache does not store answers under, another model than the one it asks, a temperature
above 0 when ``proxy_greedy_only`` is set, and a conversation that is not question/answer
turns ending in a question. A shorter ``max_tokens`` than the answers the cache stores is
answered (``answer_budget``): a cached answer only where it is no longer than that.

Whether the turns before the question are ones the cache answered, and whether their
system messages have a cache of their own, is decided afterwards (client/proxy/app.py).
"""

from dataclasses import dataclass
from typing import Any

from meancache.client.proxy.wire import ChatRequest, Message

SYSTEM_ROLES = ("system", "developer")
# Fields that change nothing in the answer, or that the proxy honours itself.
NEUTRAL = frozenset({"model", "messages", "stream", "stream_options", "max_tokens",
                     "max_completion_tokens", "temperature", "n", "user", "metadata",
                     "safety_identifier", "prompt_cache_key", "store", "service_tier"})
# Other fields are fine only when they ask for nothing (their value is the API's default).
DEFAULTS: dict[str, tuple[Any, ...]] = {
    "top_p": (1, 1.0), "frequency_penalty": (0, 0.0), "presence_penalty": (0, 0.0),
    "response_format": ({"type": "text"},), "tools": ([],), "functions": ([],),
    "tool_choice": ("none",), "function_call": ("none",), "logprobs": (False,),
    "parallel_tool_calls": (True, False), "modalities": (["text"],),
}


@dataclass(frozen=True)
class Question:
    """A request the cache may answer: its last user message after question/answer turns."""

    preamble: tuple[tuple[str, str], ...]  # (role, content) of the system messages
    history: tuple[tuple[str, str], ...]  # (question, answer) of the turns before
    text: str


@dataclass(frozen=True)
class Bypass:
    """Why the request goes straight to the upstream (a short word, for the header)."""

    reason: str


def question_of(request: ChatRequest, served_model: str, greedy_only: bool
                ) -> Question | Bypass:
    """The question the cache may answer in ``request``, or why none."""
    for name, value in (request.model_extra or {}).items():
        if name not in NEUTRAL and value is not None and value not in DEFAULTS.get(name, ()):
            return Bypass("tools" if "tool" in name or "function" in name else f"field-{name}")
    if (request.n or 1) > 1:
        return Bypass("n")
    if greedy_only and (request.temperature or 0) > 0:
        return Bypass("temperature")
    if request.model != served_model:
        return Bypass("model")
    return _turns(request.messages)


def answer_budget(request: ChatRequest, max_tokens: int) -> int | None:
    """The most answer tokens ``request`` takes where that is fewer than the cache's
    answers are asked with (``max_tokens``), else None. With greedy decoding a complete
    answer within it is the one the upstream would give under it, so a cached answer that
    fits may be served; a longer one may not (the upstream would cut it)."""
    asked = request.max_completion_tokens or request.max_tokens
    return asked if asked is not None and asked < max_tokens else None


def _turns(messages: list[Message]) -> Question | Bypass:
    """System messages first, then user/assistant turns, ending with the user's question."""
    texts: list[str] = []
    for message in messages:
        text = message.text()
        extras = (message.model_extra or {}).items()
        if message.role in ("tool", "function") or any(
                value not in (None, []) for name, value in extras if name != "name"):
            return Bypass("tools")
        if text is None:
            return Bypass("content")
        texts.append(text)
    roles = [m.role for m in messages]
    first = next((i for i, role in enumerate(roles) if role not in SYSTEM_ROLES), len(roles))
    turns = roles[first:]
    expected = ["user" if i % 2 == 0 else "assistant" for i in range(len(turns))]
    if not turns or turns != expected or turns[-1] != "user":
        return Bypass("turns")
    if not texts[-1].strip():
        return Bypass("empty-question")
    talk = texts[first:]
    return Question(tuple(zip(roles[:first], texts[:first], strict=True)),
                    tuple(zip(talk[0:-1:2], talk[1:-1:2], strict=True)), texts[-1])
