"""Validation of query text shared by every cache: what counts as a usable query."""

from meancache.shared.errors import InvalidQueryError


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
