"""clean_query: what counts as a usable query."""

import pytest
from meancache.shared.errors import InvalidQueryError, MeanCacheError
from meancache.shared.query import clean_query


def test_strips_surrounding_white_space() -> None:
    assert clean_query("  What is the capital of France?\n\t") == "What is the capital of France?"


def test_keeps_inner_white_space_and_unicode() -> None:
    assert clean_query(" naïve  café ☕ ") == "naïve  café ☕"


@pytest.mark.parametrize("text", ["", "   ", "\n\t \r", b"", b"  \n", "\u3000"])
def test_empty_queries_are_rejected(text: str | bytes) -> None:
    with pytest.raises(InvalidQueryError, match="empty"):
        clean_query(text)


def test_invalid_utf8_bytes_are_rejected() -> None:
    with pytest.raises(InvalidQueryError, match="UTF-8") as info:
        clean_query(b"caf\xe9 au lait")
    assert "offset 3" in str(info.value)


def test_lone_surrogate_is_rejected() -> None:
    text = b"bad \xff byte".decode("utf-8", "surrogateescape")
    with pytest.raises(InvalidQueryError, match="UTF-8"):
        clean_query(text)


def test_valid_bytes_are_decoded() -> None:
    assert clean_query(" café ".encode()) == "café"


def test_non_text_is_rejected() -> None:
    with pytest.raises(InvalidQueryError):
        clean_query(42)  # type: ignore[arg-type]


def test_error_is_a_value_error_and_a_meancache_error() -> None:
    with pytest.raises(ValueError):
        clean_query(" ")
    with pytest.raises(MeanCacheError):
        clean_query(" ")
