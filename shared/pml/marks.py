"""Modules without writing PML: a request marks which of its messages recur (an app's
system prompt, an attached document) in the ``Meancache-Modules`` header, e.g. ``0,3``.

A meancache upstream keeps each marked message as a Prompt Cache module, reusable at any
position: the marked messages are laid out first, at their own positions, and the other
messages follow them, so the same marked text after another history reads its states
back. Why a header: every HTTP server ignores a header it does not know (RFC 9110, 5.1),
so any other OpenAI-compatible upstream receives the ordinary request, its body byte for
byte; a body field would be refused by OpenAI's own API, which rejects unknown
parameters. The upstream reads the header as untrusted input (:func:`parse_marks`).
"""

from collections.abc import Sequence

from meancache.shared.errors import PMLError

MODULES_HEADER = "Meancache-Modules"
MAX_MARKS = 8  # modules one request may mark
MAX_HEADER_CHARS = 64  # 8 indices of up to 6 digits with their commas fit
INDEX_DIGITS = 6
# What parse_marks takes, as published in the upstream's /openapi.json (beside the rules a
# pattern cannot say: no index twice, none past the messages, never the last).
MARKS_PATTERN = (rf"^[ \t]*[0-9]{{1,{INDEX_DIGITS}}}[ \t]*"
                 rf"(,[ \t]*[0-9]{{1,{INDEX_DIGITS}}}[ \t]*){{0,{MAX_MARKS - 1}}}$")


def write_marks(indices: Sequence[int]) -> str:
    """The header's value for the messages at ``indices``."""
    return ",".join(str(i) for i in sorted(set(indices)))


def parse_marks(value: str, messages: int) -> tuple[int, ...]:
    """The marked message indices of a request of ``messages`` messages, ascending.

    Refused, with what was wrong: a value over :data:`MAX_HEADER_CHARS` characters (checked
    first), anything but comma-separated decimal indices, a repeated index, more than
    :data:`MAX_MARKS`, an index past the messages, and the last message (the question,
    which is computed anyway)."""
    if len(value) > MAX_HEADER_CHARS:
        raise PMLError(f"the {MODULES_HEADER} header has {len(value)} characters; at most "
                       f"{MAX_HEADER_CHARS} are read")
    parts = [part.strip() for part in value.split(",")]
    if not all(part.isascii() and part.isdigit() and len(part) <= INDEX_DIGITS
               for part in parts):
        raise PMLError(f"the {MODULES_HEADER} header lists message indices separated by "
                       f"commas, such as 0,2; got {value[:40]!r}")
    indices = [int(part) for part in parts]
    if len(set(indices)) != len(indices):
        raise PMLError(f"the {MODULES_HEADER} header names a message twice")
    if len(indices) > MAX_MARKS:
        raise PMLError(f"the {MODULES_HEADER} header marks {len(indices)} messages; at most "
                       f"{MAX_MARKS} may be modules")
    last = messages - 1
    if any(index >= last for index in indices):
        raise PMLError(f"the {MODULES_HEADER} header may mark messages 0 to {last - 1} of "
                       f"this request's {messages}: the last one is the question")
    return tuple(sorted(indices))
