"""Instruction logs for the instruction LM: JSON lines with a "text" field, normalised by
the one function the device also uses, and a seeded 80/10/10 split."""

import json
import random
from dataclasses import dataclass
from pathlib import Path

from meancache.shared.errors import PackError
from meancache.shared.jsonl import jsonl_lines, read_text
from meancache.shared.query import normalise_query


@dataclass(frozen=True)
class Split:
    train: list[str]
    validation: list[str]
    test: list[str]


def read_instructions(path: Path) -> list[str]:
    """Every non-empty instruction of a JSONL file, normalised, in file order."""
    texts: list[str] = []
    for number, line in jsonl_lines(read_text(path, PackError)):
        try:
            text = json.loads(line)["text"]
        except (ValueError, KeyError, TypeError):
            raise PackError(f"{path}:{number}: expected a JSON object with a \"text\" "
                            "field") from None
        if not isinstance(text, str):
            raise PackError(f"{path}:{number}: \"text\" must be a string, got {text!r:.40}")
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
