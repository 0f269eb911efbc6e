"""JSON lines as meancache reads them: one value a line, lines ended by "\\n" alone. A JSON
string may hold U+2028, U+2029 or U+0085 raw (``json.dumps(..., ensure_ascii=False)``
writes them so, and ShareGPT's first turns hold them), and ``str.splitlines`` would cut a
line at each of them; every reader of a JSONL file splits here instead."""

import json
import re
from collections.abc import Iterator
from pathlib import Path

from meancache.shared.errors import MeanCacheError

_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")  # "\ud800" to "\udfff"


def jsonl_lines(text: str) -> Iterator[tuple[int, str]]:
    """(1-based line number, line) for each line of ``text`` that is not blank."""
    for number, line in enumerate(text.split("\n"), 1):
        if line.strip():
            yield number, line


def read_text(path: Path, error: type[MeanCacheError]) -> str:
    """The UTF-8 text of ``path``, or ``error`` naming the file and what to do about it."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise error(f"{path} is not UTF-8 text; save it as UTF-8") from None
    except OSError as exc:
        raise error(f"cannot read {path}: {exc.strerror}; check the path and its "
                    "permissions") from None


def read_jsonl(path: Path, error: type[MeanCacheError], row_format: str
               ) -> Iterator[tuple[str, object]]:
    """("path:line", value) for each line of a JSONL file someone else wrote: a line that is
    not JSON, or whose strings hold a lone surrogate (an escape such as "\\ud800" that is
    half of a UTF-16 pair: no character, and no tokenizer or file can encode it), is
    ``error`` naming the line, with ``row_format`` saying what a line should be."""
    for number, line in jsonl_lines(read_text(path, error)):
        where = f"{path}:{number}"
        try:
            value = json.loads(line)
            # the line came as UTF-8, so only such an escape can make a lone surrogate
            if _SURROGATE_ESCAPE.search(line):
                json.dumps(value, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError as exc:
            raise error(f"{where}: holds a lone surrogate (\\u{ord(exc.object[exc.start]):04x}), "
                        f"not a character; {row_format}") from None
        except ValueError as exc:  # not JSON, or a number past Python's digit limit
            raise error(f"{where}: not valid JSON ({getattr(exc, 'msg', exc)}); "
                        f"{row_format}") from None
        yield where, value
