"""Text for the screen: model output may hold control bytes (the built-in random model
emits any byte), which must never reach the terminal as escape sequences."""

import re

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f\x80-\x9f]")


def printable(text: str) -> str:
    return _CONTROL.sub("\ufffd", text)
