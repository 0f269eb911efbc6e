"""What one request may ask of the server. Each limit is answered with a 4xx or 429 that
names it, before the work it would cost starts: Python's own limits (recursion, 4,300-digit
integers) and torch's (seed range) would otherwise surface as 500s, and a long prompt's
dense prefill mask grows with the square of its length."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from meancache.upstream.errors import BadRequest, PromptTooLongError, QuotaExceededError

if TYPE_CHECKING:  # the CLI reads Limits' defaults without loading torch
    from meancache.upstream.prompt_cache.engine import PreparedPrompt, SchemaUsage
    from meancache.upstream.server.wire import ChatRequest

SEED_LIMIT = 2**63  # torch.Generator.manual_seed takes a signed 64-bit seed
MAX_EXPONENT_DIGITS = 3  # a double's exponent never needs more (e-324 ... e+308)


@dataclass(frozen=True)
class Limits:
    """The server's limits; the defaults suit one small model on a CPU."""

    max_queued: int = 64  # requests waiting for the model thread; more get 429
    max_queued_per_key: int = 8  # of those, one API key's (the keys take turns)
    max_prompt_tokens: int = 4096  # new tokens one request makes the model read at once
    max_tokens: int = 4096  # the largest max_tokens (response size) a request may ask for
    max_stop_chars: int = 64  # length of each stop string (there are at most 4)
    max_json_depth: int = 32  # nesting of objects and arrays in a request body
    # digits of a JSON number (its exponent aside): any double as a JSON writer writes it
    # passes. Python writes up to 17 significant digits after up to 4 zeros
    # (0.00010042926364857862: 21 digits), JavaScript fixed notation from 1e-6 to 1e21
    # (0.0000012345678901234567 and 123456789012345680000: 23 and 21 digits).
    max_number_digits: int = 23
    max_schemas_per_key: int = 32  # PML schemas one API key may hold
    max_schema_tokens_per_key: int = 65536  # cached module tokens of those schemas together


def parse_json(body: bytes, limits: Limits) -> Any:
    """The request body as JSON, refused with BadRequest if it is not valid JSON, nests
    too deeply, has an over-long or non-finite number, or text that is not valid Unicode."""
    def number(text: str) -> str:
        # Digits are counted, not characters (a sign, a point and an exponent such as
        # e-308 add to the length of a valid double): what the cap guards against is a
        # long run of digits.
        mantissa, _, exponent = text.lower().partition("e")
        digits = sum(c.isdigit() for c in mantissa)
        if digits > limits.max_number_digits:
            raise BadRequest(f"a number in the body has {digits} digits; at most "
                             f"{limits.max_number_digits} digits are accepted")
        if len(exponent.lstrip("+-")) > MAX_EXPONENT_DIGITS:
            raise BadRequest(f"a number in the body has an exponent of {exponent[:12]!r}; "
                             f"at most {MAX_EXPONENT_DIGITS} digits are accepted there")
        return text

    def real(text: str) -> float:
        value = float(number(text))
        if not math.isfinite(value):
            raise BadRequest(f"the number {text} is out of range; send a finite number")
        return value

    def constant(name: str) -> None:
        raise BadRequest(f"{name} is not a JSON number; send a finite number")

    try:
        data = json.loads(body, parse_int=lambda text: int(number(text)), parse_float=real,
                          parse_constant=constant)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BadRequest(f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise BadRequest(_too_deep(limits)) from None
    _check_tree(data, limits)
    return data


def _too_deep(limits: Limits) -> str:
    return (f"the request body nests objects and arrays more than {limits.max_json_depth} "
            "deep; send a flatter body")


def _check_tree(data: Any, limits: Limits) -> None:
    """Depth and Unicode of a parsed body, walked without recursion."""
    stack: list[tuple[Any, int, str]] = [(data, 0, "body")]
    while stack:
        value, depth, where = stack.pop()
        if isinstance(value, str):
            try:
                value.encode("utf-8")
            except UnicodeEncodeError:
                raise BadRequest(f"{where} holds a lone surrogate (an escape such as \\ud800 "
                                 "without its pair); send valid Unicode text") from None
        elif isinstance(value, dict | list):
            if depth >= limits.max_json_depth:
                raise BadRequest(_too_deep(limits))
            pairs = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in pairs:
                place = f"{where}[{key!r}]"
                stack.append((item, depth + 1, place))
                if isinstance(key, str):
                    stack.append((key, depth + 1, f"a key in {where}"))


def check_chat(request: ChatRequest, limits: Limits) -> None:
    """The limits a chat request's parameters must keep, before its prompt is read."""
    params = request.params
    if params.max_tokens > limits.max_tokens:
        raise BadRequest(f"max_tokens is {params.max_tokens}; this server answers with at "
                         f"most {limits.max_tokens} tokens")
    long_stops = [s for s in params.stop if len(s) > limits.max_stop_chars]
    if long_stops:
        raise BadRequest(f"a stop string has {len(long_stops[0])} characters; at most "
                         f"{limits.max_stop_chars} are accepted")
    if params.seed is not None and not 0 <= params.seed < SEED_LIMIT:
        raise BadRequest(f"'seed' must lie in [0, 2^63); got {params.seed}")


def check_prompt(prepared: PreparedPrompt, limits: Limits) -> None:
    """The new tokens a prompt asks the model to read in one prefill (with the marked
    messages it computes as modules first)."""
    new = len(prepared.new_ids) + prepared.marked_tokens
    if new > limits.max_prompt_tokens:
        raise PromptTooLongError(
            f"the prompt adds {new} new tokens; this server reads at most "
            f"{limits.max_prompt_tokens} per request: shorten it, or put fixed text in a PML "
            "module")


def check_schema_usage(usage: SchemaUsage, limits: Limits) -> None:
    """What one key's schemas may hold: their number and their cached tokens together."""
    if usage.schemas > limits.max_schemas_per_key:
        raise QuotaExceededError(f"an API key may hold {limits.max_schemas_per_key} schemas; "
                                 "delete one first")
    if usage.cached_tokens > limits.max_schema_tokens_per_key:
        raise QuotaExceededError(
            f"this key's schemas would hold {usage.cached_tokens} module tokens; a key may "
            f"hold {limits.max_schema_tokens_per_key}: delete or shorten schemas")
