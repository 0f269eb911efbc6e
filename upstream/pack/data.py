"""Instruction logs for the instruction LM: JSON lines with a "text" field, normalised by
the one function the device also uses, and a seeded 80/10/10 split."""

import random
from dataclasses import dataclass
from pathlib import Path

from meancache.shared.errors import PackError
from meancache.shared.jsonl import read_jsonl
from meancache.shared.query import normalise_query

ROW_FORMAT = 'each line must be a JSON object like {"text": "an instruction"}'


@dataclass(frozen=True)
class Split:
    train: list[str]
    validation: list[str]
    test: list[str]


def read_instructions(path: Path) -> list[str]:
    """Every non-empty instruction of a JSONL file, normalised, in file order."""
    texts: list[str] = []
    for where, row in read_jsonl(path, PackError, ROW_FORMAT):
        if not isinstance(row, dict) or "text" not in row:
            raise PackError(f"{where}: not a JSON object with a \"text\" field; {ROW_FORMAT}")
        text = row["text"]
        if not isinstance(text, str):
            raise PackError(f"{where}: \"text\" must be a string, got {text!r:.40}; "
                            f"{ROW_FORMAT}")
        if key := normalise_query(text):
            texts.append(key)
    if not texts:
        raise PackError(f"{path} holds no instructions")
    return texts


def split_instructions(texts: list[str], seed: int = 0) -> Split:
    """A seeded shuffle cut 80/10/10 into train, validation and test."""
    shuffled = texts[:]
    random.Random(seed).shuffle(shuffled)
    first, second = int(len(shuffled) * 0.8), int(len(shuffled) * 0.9)
    return Split(shuffled[:first], shuffled[first:second], shuffled[second:])
