"""The STS benchmark's sentence pairs as outside data: statements nobody here wrote, scored
0-5 by annotators for how much they mean the same (Agirre et al., SemEval-2017 Task 1).
Read from a folder holding its ``sts-train.csv``, ``sts-dev.csv`` and ``sts-test.csv``
(the STS wiki's stsbenchmark.tar.gz, or a repository snapshot of it); never copied into
this repository, never trained or tuned on.

Only the genres whose text may be used freely are read (the benchmark's LICENSE.txt):
Flickr/PASCAL image captions (CC BY-SA), SNLI captions (track5.en-en, CC BY-SA 4.0), Stack
Exchange answers (answer-answer, CC BY-SA 3.0) and news headlines (European Media Monitor,
acknowledged); the Microsoft corpora (MSRpar, MSRvid: research licence) and DEFT (no
licence stated) are left out. The scores are CC BY-SA 4.0.

A pair scored at least ``SAME`` (4: "mostly equivalent, some unimportant details differ")
is taken as one meaning, so one answer; a pair scored from ``NEAR`` to ``DIFFERENT`` (2 to
3: "roughly equivalent, but some important information differs", down to "not equivalent,
but share some details") as a near-miss, whose answers differ. The bands are the
annotation guideline's, fixed before any measurement.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from meancache.shared.pairs import Pair

FREE_TEXT = frozenset({"images", "track5.en-en", "answer-answer", "headlines"})
SAME, DIFFERENT, NEAR = 4.0, 3.0, 2.0
FILES = ("sts-train.csv", "sts-dev.csv", "sts-test.csv")


@dataclass(frozen=True)
class ScoredPair:
    genre: str  # the source (images, headlines...): the benchmark's "file" column
    score: float
    s1: str
    s2: str


def read_sts(folder: Path) -> list[ScoredPair]:
    """Every pair of the free-text genres in the three files (tab-separated: genre, file,
    year, id, score, sentence 1, sentence 2, then sources some rows carry)."""
    missing = [name for name in FILES if not (folder / name).is_file()]
    if missing:
        raise SystemExit(f"{folder} lacks {', '.join(missing)}: pass the folder of the STS "
                         "benchmark's csv files (stsbenchmark/ in its archive)")
    pairs = []
    for name in FILES:
        with (folder / name).open(encoding="utf-8", newline="") as file:
            for fields in csv.reader(file, delimiter="\t", quoting=csv.QUOTE_NONE):
                if len(fields) >= 7 and fields[1] in FREE_TEXT:
                    pairs.append(ScoredPair(fields[1], float(fields[4]), fields[5].strip(),
                                            fields[6].strip()))
    return pairs


def labelled(pairs: list[ScoredPair]) -> list[Pair]:
    """The pairs of one meaning (label 1) and the near-misses (label 0); the rest (between
    the bands, or sharing almost nothing) left out."""
    out = []
    for p in pairs:
        if p.score >= SAME:
            out.append(Pair(p.s1, p.s2, 1))
        elif NEAR <= p.score <= DIFFERENT:
            out.append(Pair(p.s1, p.s2, 0))
    return out
