"""The threshold evidence a device sends with its training reply: how many of its labelled
validation pairs, duplicates and distinct ones, fall in each similarity bin.

A device's own F0.5-best threshold rests on a few dozen pairs and jumps around; averaging
such point estimates dragged the global threshold (issue 13: 0.869 -> 0.761 -> 0.809).
Counts can be pooled instead: the server adds up the round's histograms and tunes one
threshold on all of them (fl_server.pooled_threshold), knowing how much evidence it has.
What travels is BINS small whole numbers per class: no similarity value, no text.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from meancache.shared.threshold import BETA

BINS = 400  # on [-1, 1]: 0.005 wide, finer than any threshold the evidence can tell apart
LOW, HIGH = -1.0, 1.0
WIDTH = (HIGH - LOW) / BINS
DUPLICATES = "duplicates-by-similarity"
DISTINCT = "distinct-by-similarity"
KEYS = (DUPLICATES, DISTINCT)


def binned(metrics: Mapping[str, object], keys: Sequence[str], bins: int, what: str,
           unit: str) -> list[list[Any]]:
    """The list a reply's metrics hold under each of ``keys``, each of ``bins`` values, or
    ValueError naming the key (``what``: the evidence, ``unit``: what its values are)."""
    lists = []
    for key in keys:
        value = metrics.get(key)
        if not isinstance(value, list) or len(value) != bins:
            raise ValueError(f"its {what} is malformed: '{key}' must be a list of {bins} {unit}")
        lists.append(value)
    return lists


def _bin(similarities: np.ndarray) -> np.ndarray:
    index = np.floor((np.asarray(similarities, dtype=np.float64) - LOW) / WIDTH)
    return np.clip(index, 0, BINS - 1).astype(np.int64)


def edges() -> np.ndarray:
    """The thresholds the evidence can score: the lower edge of every bin."""
    return np.round(LOW + WIDTH * np.arange(BINS), 6)


@dataclass(frozen=True)
class Evidence:
    duplicates: np.ndarray  # int64, BINS counts
    distinct: np.ndarray

    @classmethod
    def empty(cls) -> "Evidence":
        return cls(np.zeros(BINS, np.int64), np.zeros(BINS, np.int64))

    @classmethod
    def of_pairs(cls, similarities: np.ndarray, labels: np.ndarray) -> "Evidence":
        bins, labs = _bin(similarities), np.asarray(labels).astype(bool)
        return cls(np.bincount(bins[labs], minlength=BINS).astype(np.int64),
                   np.bincount(bins[~labs], minlength=BINS).astype(np.int64))

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, object]) -> "Evidence":
        """A reply's evidence, or ValueError saying what is wrong with it."""
        counts = []
        for key, value in zip(KEYS, binned(metrics, KEYS, BINS, "similarity evidence",
                                           "counts"), strict=True):
            array = np.asarray(value, dtype=np.float64)
            if not (np.isfinite(array).all() and (array >= 0).all()
                    and (array == np.round(array)).all()):
                raise ValueError(f"its similarity evidence is malformed: '{key}' must "
                                 "hold whole numbers >= 0")
            counts.append(array.astype(np.int64))
        return cls(*counts)

    def to_metrics(self) -> dict[str, list[int]]:
        return {DUPLICATES: self.duplicates.tolist(), DISTINCT: self.distinct.tolist()}

    @property
    def pairs(self) -> int:
        return int(self.duplicates.sum() + self.distinct.sum())

    def __add__(self, other: "Evidence") -> "Evidence":
        return Evidence(self.duplicates + other.duplicates, self.distinct + other.distinct)

    def at_most(self, pairs: float) -> "Evidence":
        """Scaled down to ``int(pairs)`` pairs in all, each class in proportion (largest
        remainders rounded up, so the shape stays): no device's evidence weighs more than
        screening allows."""
        if self.pairs <= pairs:
            return self
        duplicates = round(int(pairs) * int(self.duplicates.sum()) / self.pairs)
        return Evidence(_scaled(self.duplicates, duplicates),
                        _scaled(self.distinct, int(pairs) - duplicates))

    def f05(self, thresholds: np.ndarray) -> np.ndarray:
        """F0.5 of each threshold on these pairs; a threshold counts the bins from the
        edge nearest to it upwards."""
        start = np.clip(np.round((np.asarray(thresholds, np.float64) - LOW) / WIDTH),
                        0, BINS).astype(np.int64)
        above_dup = np.r_[np.cumsum(self.duplicates[::-1])[::-1], 0][start]
        above_dis = np.r_[np.cumsum(self.distinct[::-1])[::-1], 0][start]
        positives = self.duplicates.sum()
        b2 = BETA * BETA
        with np.errstate(divide="ignore", invalid="ignore"):
            precision = np.where(above_dup + above_dis > 0,
                                 above_dup / (above_dup + above_dis), 0.0)
            recall = above_dup / positives if positives else np.zeros(len(start))
            denom = b2 * precision + recall
            return np.where(denom > 0, (1 + b2) * precision * recall / denom, 0.0)



def _scaled(counts: np.ndarray, total: int) -> np.ndarray:
    """``counts`` scaled to sum to ``total`` in whole numbers."""
    if counts.sum() == 0:
        return counts
    exact = counts * (total / counts.sum())
    whole = np.floor(exact).astype(np.int64)
    whole[np.argsort(whole - exact, kind="stable")[:total - int(whole.sum())]] += 1
    return whole
