"""Text for the screen: model output may hold control bytes (the built-in random model
emits any byte), which must never reach the terminal as escape sequences."""

import re

from meancache.client.chat.conversations import Turn

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def printable(text: str) -> str:
    return _CONTROL.sub("\ufffd", text)


def badge(turn: Turn) -> str:
    """Where an answer came from, in one line."""
    if turn.source == "cache":
        line = f"cache · similarity {turn.similarity:.2f} · matched “{turn.matched_query}”"
    elif turn.source == "pack":
        line = "pack"
    else:
        ttft = "?" if turn.ttft_seconds is None else f"{turn.ttft_seconds * 1000:.0f} ms"
        line = f"upstream · first token {ttft} · {turn.cached_tokens} prompt tokens reused"
    if turn.replaced is not None:
        line += " · replaced a rejected cached answer"
    if turn.truncated:
        line += " · question truncated for matching"
    return printable(line)
