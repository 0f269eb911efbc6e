"""What a question is, for every cache and the pack builder: ``clean_query`` says whether
a text is a usable question (and strips it), ``normalise_query`` says when two questions
are the same one (the pack's lookup key, and the text every match embeds).

The normalisation rules, in order:
1. Unicode NFKC, so full-width letters, ligatures and compatibility forms compare equal
   to their plain forms;
2. ``casefold`` (a stronger ``lower``: "Straße" and "STRASSE" meet), as InstCache
   lower-cases instructions;
3. every run of white space (newlines and tabs included) becomes one space, and the ends
   are stripped;
4. trailing sentence punctuation (``.?!`` and their full-width forms, and white space
   between them) is dropped: "What is Python?" and "what is python" are one question.
   Punctuation inside the text is kept: it can change the meaning ("3.5", "C++").
"""

import re
import unicodedata

from meancache.shared.errors import InvalidQueryError

_SPACE = re.compile(r"\s+")
_TRAILING = re.compile(r"[\s.?!。？！…]+$")


def clean_query(text: str | bytes) -> str:
    """Return the query stripped of surrounding white space, or raise InvalidQueryError.

    Bytes must be valid UTF-8; a str must not carry lone surrogates (what
    ``surrogateescape`` leaves behind for undecodable input).
    """
    if isinstance(text, bytes):
        try:
            text = text.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InvalidQueryError(
                f"query is not valid UTF-8 (bad byte at offset {exc.start}); send the text as UTF-8"
            ) from None
    if not isinstance(text, str):
        raise InvalidQueryError(
            f"query must be text, not {type(text).__name__}; pass a str or UTF-8 bytes")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidQueryError(
            f"query is not valid UTF-8 (undecodable character at position {exc.start}); "
            "remove the character or send the text as UTF-8"
        ) from None
    text = text.strip()
    if not text:
        raise InvalidQueryError("query is empty; ask a question with some text in it")
    return text


def normalise_query(text: str) -> str:
    """The key of "the same question"; "" when nothing but punctuation is left."""
    text = unicodedata.normalize("NFKC", text).casefold()
    text = _SPACE.sub(" ", text).strip()
    return _TRAILING.sub("", text)


def embedding_text(text: str) -> str:
    """The text a question is embedded as, on every side: normalised, or as given when
    nothing but punctuation would be left."""
    return normalise_query(text) or text
