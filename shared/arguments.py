"""argparse types for numeric options, and the check that a text from argv or the
environment is text. A value outside its option's range is refused by argparse, naming the
option, before anything loads (without them a negative `--limit` sliced the pairs from the
end, `--explore 2` explored every hit, and `fl simulate --learning-rate -1` ran its rounds
with every device failing unseen); a byte the locale could not decode is named with its
option or variable before anything tries to encode it."""

import argparse
import math
from collections.abc import Callable


def count(minimum: int = 0, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number from ``minimum`` to ``maximum`` (no upper end where None)."""
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{value[:20]!r} is not a whole number") from None
        if number < minimum or (maximum is not None and number > maximum):
            raise argparse.ArgumentTypeError(
                f"{number} is out of range (allowed: {_range(minimum, maximum)})")
        return number

    return parse


def real(minimum: float | None = None, maximum: float | None = None,
         above: float | None = None) -> Callable[[str], float]:
    """A finite number, at least ``minimum`` (or greater than ``above``), at most
    ``maximum``."""
    def parse(value: str) -> float:
        try:
            number = float(value)
        except ValueError:
            number = math.nan
        if not math.isfinite(number):
            raise argparse.ArgumentTypeError(f"{value[:20]!r} is not a finite number")
        if ((minimum is not None and number < minimum)
                or (above is not None and number <= above)
                or (maximum is not None and number > maximum)):
            raise argparse.ArgumentTypeError(
                f"{value} is out of range (allowed: {_range(minimum, maximum, above)})")
        return number

    return parse


def share() -> Callable[[str], float]:
    """A share or a probability: from 0 to 1."""
    return real(0.0, 1.0)


def _range(minimum: float | None, maximum: float | None, above: float | None = None) -> str:
    """"0 to 1", "1 or more", "more than 0, at most 2"."""
    if minimum is not None and maximum is not None:
        return f"{minimum:g} to {maximum:g}"
    low = (f"more than {above:g}" if above is not None
           else f"{minimum:g} or more" if minimum is not None else "")
    high = f"at most {maximum:g}" if maximum is not None else ""
    return ", ".join(part for part in (low, high) if part)


def undecodable_byte(value: object) -> int | None:
    """The first byte the locale could not decode in a text (or a list of texts) that came
    from argv or the environment: Python keeps it as a lone surrogate, U+DC80-U+DCFF, which
    no URL, header, JSON body or terminal can encode. None for anything else."""
    for text in value if isinstance(value, list) else [value]:
        if isinstance(text, str):
            for char in text:
                if "\udc80" <= char <= "\udcff":
                    return ord(char) - 0xDC00
    return None


def undecodable_setting(where: str, value: object) -> str | None:
    """The message for a setting (a file key, an environment variable) holding such a
    byte, naming ``where`` it was set; None when it is text."""
    if (byte := undecodable_byte(value)) is None:
        return None
    return f"{where} holds the byte 0x{byte:02x}, which is not UTF-8 text; set it as UTF-8"


def undecodable_text(args: argparse.Namespace, argv: list[str]) -> str | None:
    """The first option holding such a byte, named as ``argv`` spelled it, with the byte;
    None when every text option is text. Options typed as paths are not checked: the file
    functions take such bytes back."""
    for name, value in vars(args).items():
        if (byte := undecodable_byte(value)) is not None:
            flag = "--" + name.replace("_", "-")
            named = flag if any(a == flag or a.startswith(flag + "=") for a in argv) else name
            return (f"argument {named}: holds the byte 0x{byte:02x}, which is not UTF-8 text; "
                    "pass it as UTF-8")
    return None
