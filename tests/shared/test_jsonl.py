"""JSON lines (shared.jsonl): a line ends at "\\n" alone, so a text holding a line or
paragraph separator raw (ShareGPT's first turns do) is read whole by every reader."""

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.shared.errors import MeanCacheError, PackError, PairsFileError, VerifierError
from meancache.shared.jsonl import jsonl_lines, read_text
from meancache.shared.pairs import read_pairs
from meancache.shared.verifier.rows import read_rows
from meancache.upstream.pack.data import read_instructions

SEPARATORS = "line\u2028paragraph\u2029next line\x85form\x0cfeed"

rows = st.lists(st.dictionaries(st.sampled_from(["q1", "text", "answer"]), st.text()),
                max_size=8)


@given(rows)
def test_rows_written_with_their_separators_raw_read_back_whole(written: list[dict]) -> None:
    text = "".join(json.dumps(row, ensure_ascii=False) + "\n" for row in written)
    assert [json.loads(line) for _, line in jsonl_lines(text)] == written


def test_line_numbers_count_the_blank_lines_skipped() -> None:
    assert list(jsonl_lines('{"a": 1}\n\n  \n{"b": 2}\n')) == [(1, '{"a": 1}'), (4, '{"b": 2}')]


@pytest.mark.parametrize(("read", "row", "got"), [
    (lambda p: read_pairs(p)[0].q1, {"q1": SEPARATORS, "q2": "b", "label": 1}, SEPARATORS),
    (lambda p: read_rows(p, ("text",))[0]["text"], {"text": SEPARATORS}, SEPARATORS),
    # normalised: the separators are white space
    (lambda p: read_instructions(p)[0], {"text": SEPARATORS}, " ".join(SEPARATORS.split())),
], ids=["pairs", "rows", "instructions"])
def test_each_reader_takes_a_row_holding_separators_as_one_row(
        tmp_path: Path, read: Callable[[Path], str], row: dict, got: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert read(path) == got


@pytest.mark.parametrize("error", [PairsFileError, VerifierError, PackError])
def test_an_unreadable_file_is_named_with_what_to_do(tmp_path: Path,
                                                     error: type[MeanCacheError]) -> None:
    with pytest.raises(error, match=r"cannot read .*missing\.jsonl: No such file or "
                                    "directory; check the path"):
        read_text(tmp_path / "missing.jsonl", error)
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes('{"text": "größer"}\n'.encode("latin-1"))
    with pytest.raises(error, match=r"latin\.jsonl is not UTF-8 text; save it as UTF-8"):
        read_text(latin, error)


READERS = [(read_pairs, PairsFileError, '{"q1": "%s", "q2": "b", "label": 1}'),
           (lambda p: read_rows(p, ("q1", "q2")), VerifierError, '{"q1": "%s", "q2": "b"}'),
           (read_instructions, PackError, '{"text": "%s"}')]


@pytest.mark.parametrize(("read", "error", "row"), READERS,
                         ids=["pairs", "rows", "instructions"])
def test_a_lone_surrogate_is_named_by_its_line_not_met_by_the_tokenizer(
        tmp_path: Path, read: Callable[[Path], object], error: type[MeanCacheError],
        row: str) -> None:
    """eval pairs and pack train-lm ended in tracebacks (the tokenizers' TypeError and
    UnicodeEncodeError) on a "\\ud800" escape: valid JSON, but not a character."""
    path = tmp_path / "rows.jsonl"
    path.write_text(row % "an emoji \\ud83d\\ude00 is a pair" + "\n"
                    + row % "half of one \\ud800 is not" + "\n", encoding="utf-8")
    with pytest.raises(error, match=r"rows\.jsonl:2: holds a lone surrogate \(\\ud800\), "
                                    "not a character; each line must be"):
        read(path)


@pytest.mark.parametrize(("read", "error", "row"), READERS,
                         ids=["pairs", "rows", "instructions"])
def test_a_line_that_is_not_json_is_named_with_why(
        tmp_path: Path, read: Callable[[Path], object], error: type[MeanCacheError],
        row: str) -> None:
    path = tmp_path / "rows.jsonl"
    path.write_text(row % "fine" + "\n" + "1" * 5000 + "\n{cut\n", encoding="utf-8")
    with pytest.raises(error, match=r"rows\.jsonl:2: not valid JSON \(Exceeds the limit"):
        read(path)  # a number past Python's digit limit: a ValueError that is not JSON's
    path.write_text(row % "fine" + "\n{cut\n", encoding="utf-8")
    with pytest.raises(error, match=r"rows\.jsonl:2: not valid JSON \(Expecting property"):
        read(path)


def test_an_instruction_that_is_not_a_string_is_named_by_its_line(tmp_path: Path) -> None:
    path = tmp_path / "instructions.jsonl"
    path.write_text('{"text": "fine"}\n{"text": 5}\n', encoding="utf-8")
    with pytest.raises(PackError, match=r'instructions\.jsonl:2: "text" must be a string'):
        read_instructions(path)
