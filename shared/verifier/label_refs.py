"""The teacher's labels committed by reference: a ``label-pairs`` file with each question
replaced by the sha256 of its text, restored byte for byte from ``../shared/data``.

The labels are what lets the student be reproduced without the teacher (hours of
labelling), but their texts are the shared data sets', which are read from where they
are and never copied into the repo. So the repo keeps the rows with hashes in place of
texts (every other field, in the same key order), and ``restore`` finds each text again
among the question sets ``mine-pairs`` read (``mine.question_sets``), rewrites the rows
as ``label.py`` wrote them, and writes nothing unless the result has the original file's
sha256: another version of the data is refused, not silently distilled on."""

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from meancache.shared.errors import VerifierError
from meancache.shared.files import write_atomic
from meancache.shared.verifier.mine import question_sets
from meancache.shared.verifier.rows import jsonl_text, read_rows

TEXTS = ("q1", "q2")  # the label-pairs fields that hold the shared data's texts
SHOWN = 3  # missing texts named in an error


def ref_field(field: str) -> str:
    return f"{field}_sha256"


def text_sha256(text: str) -> str:
    """The hex sha256 of a text's UTF-8 (a lone surrogate JSON allows kept as is)."""
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def summary_path(path: Path) -> Path:
    """The summary beside a JSONL, where label-pairs (and distil's reading) puts it."""
    return path.with_suffix(".json")


def pack(labels: Path, out: Path, data_root: Path) -> dict:
    """Write ``out`` (the rows by reference) and its summary beside it; returns the
    summary. Refused unless every text is found in ``data_root`` and the rows restore to
    the very bytes of ``labels``."""
    _distinct(labels, out)
    data = _read_bytes(labels)
    rows = read_rows(labels, TEXTS)
    sha = hashlib.sha256(data).hexdigest()
    if jsonl_text(rows).encode() != data:
        raise VerifierError(f"{labels} is not written as `meancache verifier label-pairs` "
                            "writes it (one json.dumps row a line), so its rows would not "
                            "restore to the same bytes")
    summary = _json(summary_path(labels), "the label-pairs summary of " + str(labels))
    teacher = summary.get("teacher")
    if not isinstance(teacher, dict) or not isinstance(teacher.get("weights_sha256"), str) \
            or summary.get("labels_sha256") != sha:
        raise VerifierError(f"{summary_path(labels)} is not the label-pairs summary of "
                            f"{labels} (it must name the teacher weights and the labels' "
                            f"sha256, {sha[:12]}...)")
    # question_sets keeps the first text of each case-and-spacing variant under its cap;
    # the longest label's length keeps the one any cap mine-pairs used at or above it kept
    max_chars = max(len(row[f]) for row in rows for f in TEXTS)
    texts = _texts(data_root, max_chars)
    _check_found(rows, texts, lambda row, f: text_sha256(row[f]), labels, data_root)
    refs = [_swapped(row, {f: (ref_field(f), text_sha256(row[f])) for f in TEXTS})
            for row in rows]
    record = {"labels": {"name": labels.name, "sha256": sha, "rows": len(rows),
                         "bytes": len(data)},
              "texts": {"fields": {f: ref_field(f) for f in TEXTS},
                        "hash": "sha256 of the text's UTF-8",
                        "found_in": "meancache.shared.verifier.mine.question_sets(data_root, "
                                    "max_chars) (what mine-pairs reads)",
                        "max_chars": max_chars, "data_root": str(data_root),
                        "distinct": len({r[ref_field(f)] for r in refs for f in TEXTS})},
              "label_pairs_summary": summary}
    write_atomic(out, jsonl_text(refs))
    write_atomic(summary_path(out), json.dumps(record, indent=2) + "\n")
    return record


def restore(refs: Path, out: Path, data_root: Path) -> dict:
    """Write the labels file ``refs`` stands for into ``out``, and its label-pairs summary
    beside it (as distil reads it); returns the refs' summary. Nothing is written unless
    every text is found and the rows have the recorded sha256."""
    _distinct(refs, out)
    record = _json(summary_path(refs), "the summary of " + str(refs))
    try:
        expected, max_chars = record["labels"]["sha256"], int(record["texts"]["max_chars"])
        summary = record["label_pairs_summary"]
    except (KeyError, TypeError, ValueError):
        raise VerifierError(f"{summary_path(refs)} is not a pack-labels summary (no labels "
                            "sha256, max_chars or label-pairs summary); pack the labels "
                            "again") from None
    rows = read_rows(refs, tuple(ref_field(f) for f in TEXTS))
    texts = _texts(data_root, max_chars)
    _check_found(rows, texts, lambda row, f: row[ref_field(f)], refs, data_root)
    labels = [_swapped(row, {ref_field(f): (f, texts[row[ref_field(f)]]) for f in TEXTS})
              for row in rows]
    data = jsonl_text(labels).encode()
    sha = hashlib.sha256(data).hexdigest()
    if sha != expected:
        raise VerifierError(f"the labels restored from {refs} have sha256 {sha[:12]}..., "
                            f"not the recorded {str(expected)[:12]}...: the refs file or its "
                            f"summary was changed; nothing written to {out}")
    write_atomic(out, data)
    write_atomic(summary_path(out), json.dumps(summary, indent=2) + "\n")
    return record


def _texts(data_root: Path, max_chars: int) -> dict[str, str]:
    """sha256 -> text over the question sets mine-pairs read."""
    return {text_sha256(q.text): q.text for q in question_sets(data_root, max_chars)}


def _check_found(rows: list[dict], texts: dict[str, str],
                 sha_of: Callable[[dict, str], str], path: Path, data_root: Path) -> None:
    """Refuse rows whose texts ``data_root`` lacks (``sha_of``: a row's field's text
    sha256), naming the first few."""
    missing = [(number, f, sha_of(row, f)) for number, row in enumerate(rows, 1)
               for f in TEXTS if sha_of(row, f) not in texts]
    if missing:
        named = ", ".join(f"row {n} {f} (sha256 {s[:12]}...)" for n, f, s in missing[:SHOWN])
        raise VerifierError(f"{len(missing)} texts of {path} are not among the question sets "
                            f"of {data_root} ({named}{', ...' if len(missing) > SHOWN else ''})"
                            ": that is another version of the data, or not the shared data "
                            "at all, so the labels could not be restored from it")


def _swapped(row: dict, replace: dict[str, tuple[str, str]]) -> dict:
    """The row with each key of ``replace`` renamed and given a new value, in place."""
    return dict(replace.get(key, (key, value)) for key, value in row.items())


def _distinct(source: Path, out: Path) -> None:
    """An output (or its summary) that would overwrite the input or its summary is
    refused: the labels it came from would be lost."""
    inputs = {p.resolve() for p in (source, summary_path(source))}
    if {p.resolve() for p in (out, summary_path(out))} & inputs:
        raise VerifierError(f"--out {out} would overwrite {source} or its summary; write "
                            "to another file")


def _read_bytes(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise VerifierError(f"cannot read {path}: {exc.strerror}") from None


def _json(path: Path, what: str) -> dict:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VerifierError(f"cannot read {what}, {path}: {exc}") from None
    if not isinstance(value, dict):
        raise VerifierError(f"{path} is not a JSON object ({what})")
    return value
