"""Labelled query pairs (JSONL with q1, q2, label 0/1): what thresholds are tuned and
scored on, and what the encoder is trained on in federated learning."""

from dataclasses import dataclass
from pathlib import Path

from meancache.shared.errors import PairsFileError
from meancache.shared.jsonl import read_jsonl

ROW_FORMAT = 'each line must be a JSON object like {"q1": "...", "q2": "...", "label": 0 or 1}'


@dataclass(frozen=True)
class Pair:
    q1: str
    q2: str
    label: int


def read_pairs(path: Path, split: str | None = None, limit: int | None = None
               ) -> list[Pair]:
    """JSONL rows with q1, q2 and label (0/1); other fields are ignored."""
    pairs: list[Pair] = []
    for where, row in read_jsonl(path, PairsFileError, ROW_FORMAT):
        pair = _parse(row, where)
        if split is not None and pair[1] != split:
            continue
        pairs.append(pair[0])
        if limit is not None and len(pairs) >= limit:
            break
    if not pairs:
        raise PairsFileError(
            f"{path} holds no pairs" + (f" with split {split!r}" if split else "")
            + f"; {ROW_FORMAT}"
        )
    return pairs


def _parse(row: object, where: str) -> tuple[Pair, object]:
    if not isinstance(row, dict):
        raise PairsFileError(f"{where}: not a JSON object; {ROW_FORMAT}")
    for key in ("q1", "q2"):
        if not isinstance(row.get(key), str) or not row[key].strip():
            raise PairsFileError(f"{where}: {key!r} must be a non-empty string")
    label = row.get("label")
    if label not in (0, 1) or isinstance(label, bool):
        raise PairsFileError(f"{where}: 'label' must be 0 or 1, got {label!r}")
    return Pair(row["q1"].strip(), row["q2"].strip(), int(label)), row.get("split")
