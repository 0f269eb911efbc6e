"""JSONL rows of text fields (question sets, mined and labelled pairs), read with a clear
error for a bad row, and written in the one form label-pairs' files (and their restored
copies, byte for byte) take."""

import json
from pathlib import Path

from meancache.shared.errors import VerifierError
from meancache.shared.jsonl import read_jsonl


def read_rows(path: Path, fields: tuple[str, ...]) -> list[dict]:
    """The JSON objects of ``path``, each with a non-empty string under every one of
    ``fields`` (other fields are kept)."""
    found = []
    wanted = "a JSON object with non-empty string " + " and ".join(repr(f) for f in fields)
    for where, row in read_jsonl(path, VerifierError, f"each line must be {wanted}"):
        if not (isinstance(row, dict) and all(isinstance(row.get(f), str) and row[f].strip()
                                              for f in fields)):
            raise VerifierError(f"{where}: not {wanted}")
        found.append(row)
    if not found:
        raise VerifierError(f"{path} holds no rows")
    return found


def jsonl_text(rows: list[dict]) -> str:
    """``rows`` as JSONL, one ``json.dumps`` per line: the bytes a labels file's sha256
    names, so every writer of one uses this."""
    return "".join(json.dumps(row) + "\n" for row in rows)
