"""The error-bound evidence a device sends with its training reply, and the pooled sum the
FL server publishes in its signed global model: what the device's labels (the judge's
score of a served-region pair, whether the cached answer was wrong, and the probability it
was labelled: client.learning.bound) say, binned by score.

Per bin of the judge's score (the learned verifier's probability) travel four sums over
the labels in it: their count, their inverse-probability weights w (= 1 / labelled_with),
w² and w·wrong. These are exactly what the bound's test reads (the weighted error share
and Kish's effective sample size of every tail of labels are sums of them), so labels
pooled from many devices merge with a device's own without loss but the score's bin: a
pooled bin stands for labels scoring its lower edge. No text, no entry, no score travels.

Scores mean something only to the judge that gave them (a new global verifier scores on
another scale), so a round names the judge whose labels devices send (``ROUND_JUDGE`` in
its config: the sha256 identifying the verifier the devices run, see
fl_server.round_model), the pool the server publishes names it (``judge``, in its
record), and a device applies a pool only where it names the judge the device runs
(client.learning.state). A reply's sums carry no judge: the round names it.

A round pools two judges at once, each exactly alike (the same checks, caps and sums):
the verifier's (``KEYS``, ``ROUND_JUDGE``, the record's ``bound``) and the embedding's
cosine (``COSINE_KEYS``, ``ROUND_COSINE_JUDGE``, the record's ``cosine_bound``), whose
labels a cache with the learned verifier off learns. The cosine is named by the vector
space it was measured in (``cosine_judge``): the encoder's version, which FL's global
weights change, so the round names the full space of the encoder the devices run with
the model it sends (fl_server.round_model); a cache with its own PCA layer measures in a
space no other device shares, and its labels are not sent. A pool names the judge of the
model before the one it is published with: every round trains the encoder (and the
version hashes the whole model), so the cosine's pool, like a federated verifier's,
applies only to a cache still running that model, except in a run that federates the
verifier alone (train-encoder = 0), where the cosine stays the base model's
(docs/cache.md).

A reply's sums are checked before they count: a label's weight lies in [1, MAX_WEIGHT]
(a labelling probability of at least 1e-3, as the bound clips it), so a bin's weight lies
between its count and MAX_WEIGHT times it, its squares between weight²/count
(Cauchy–Schwarz) and MAX_WEIGHT times its weight, and its wrong weight within its weight.
"""

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from meancache.shared.fl.evidence import binned

BINS = 256  # on [0, 1]: 1/256 wide (a dyadic width: a score on the grid bins exactly)
MAX_WEIGHT = 1000.0  # 1 / the lowest labelling probability the bound admits (1e-3)
COUNT = "bound-labels"
WEIGHT = "bound-weight"
SQUARES = "bound-weight-squared"
WRONG = "bound-weight-wrong"
KEYS = (COUNT, WEIGHT, SQUARES, WRONG)
COSINE_KEYS = tuple(f"cosine-{key}" for key in KEYS)  # the same sums, the cosine's labels
RECORD_BINS = "bins"  # the published record: only the bins that hold labels
JUDGE = "judge"  # the published record: whose scores its labels are
ROUND_JUDGE = "bound-judge"  # a round's config: the judge whose labels devices send
ROUND_COSINE_JUDGE = "bound-cosine-judge"  # ... and the cosine whose labels they send
COSINE_JUDGE = "cosine"  # with the learned verifier off, the embedding's cosine judges
_MAX_JUDGE = 128  # characters of a judge's name (a sha256 is 64)
_SLACK = 1e-9  # relative: sums added in another order differ in their last bits


def cosine_judge(encoder_version: str) -> str:
    """The embedding's cosine as a judge's name: one per vector space (a cosine means
    something only in the space it was measured in: ``Encoder.version``)."""
    return f"{COSINE_JUDGE} {encoder_version}"


def _bin(scores: np.ndarray) -> np.ndarray:
    index = np.floor(np.asarray(scores, dtype=np.float64) * BINS)
    return np.clip(index, 0, BINS - 1).astype(np.int64)


def edges() -> np.ndarray:
    """The score each bin stands for: its lower edge."""
    return np.arange(BINS, dtype=np.float64) / BINS


@dataclass(frozen=True)
class BoundEvidence:
    count: np.ndarray  # float64, BINS each (a device's counts are whole; pooled ones scaled)
    weight: np.ndarray
    squares: np.ndarray
    wrong: np.ndarray
    judge: str = ""  # whose scores ("": a reply's, which the round names, or an old pool)

    @classmethod
    def empty(cls) -> "BoundEvidence":
        return cls(*(np.zeros(BINS) for _ in KEYS))

    @classmethod
    def of_labels(cls, scores: np.ndarray, wrong: np.ndarray, weights: np.ndarray
                  ) -> "BoundEvidence":
        """The sums of labels scoring ``scores`` with inverse-probability ``weights``."""
        bins = _bin(scores)
        w = np.asarray(weights, dtype=np.float64)
        x = np.asarray(wrong, dtype=np.float64)
        return cls(*(np.bincount(bins, v, minlength=BINS).astype(np.float64)
                     for v in (np.ones(len(w)), w, w * w, w * x)))

    @classmethod
    def from_metrics(cls, metrics: Mapping[str, Any], keys: tuple[str, ...] = KEYS
                     ) -> "BoundEvidence":
        """A reply's evidence under ``keys`` (``COSINE_KEYS``: the cosine's; none where it
        holds none of them), or ValueError saying what is wrong with it."""
        if not any(key in metrics for key in keys):
            return cls.empty()
        evidence = cls(*(_numbers(value, key) for key, value in zip(
            keys, binned(metrics, keys, BINS, "bound evidence", "numbers"), strict=True)))
        if not (evidence.count == np.round(evidence.count)).all():
            raise ValueError(f"its bound evidence is malformed: '{keys[0]}' must hold whole "
                             "numbers")
        evidence.check()
        return evidence

    def to_metrics(self, keys: tuple[str, ...] = KEYS) -> dict[str, list[float]]:
        return {key: array.tolist() for key, array in zip(keys, self._arrays(), strict=True)}

    @classmethod
    def from_record(cls, record: Any) -> "BoundEvidence":
        """The published form (``to_record``) read back, or ValueError saying what is
        wrong with it."""
        if record is None or record == {}:
            return cls.empty()
        if not isinstance(record, dict) or set(record) - {JUDGE} != {RECORD_BINS, *KEYS}:
            raise ValueError(f"the pooled bound evidence must be an object of "
                             f"'{RECORD_BINS}', {', '.join(repr(k) for k in KEYS)} and "
                             f"optionally '{JUDGE}'")
        judge = record.get(JUDGE, "")
        if not isinstance(judge, str) or len(judge) > _MAX_JUDGE:
            raise ValueError(f"the pooled bound evidence's '{JUDGE}' must be a name of at "
                             f"most {_MAX_JUDGE} characters")
        bins = record[RECORD_BINS]
        if (not isinstance(bins, list) or len(bins) > BINS
                or not all(isinstance(b, int) and not isinstance(b, bool) for b in bins)
                or len(set(bins)) != len(bins) or not all(0 <= b < BINS for b in bins)):
            raise ValueError(f"the pooled bound evidence's '{RECORD_BINS}' must be distinct "
                             f"bin numbers in [0, {BINS})")
        arrays = []
        for key in KEYS:
            value = record[key]
            if not isinstance(value, list) or len(value) != len(bins):
                raise ValueError(f"the pooled bound evidence's '{key}' must hold one number "
                                 f"per bin ({len(bins)})")
            dense = np.zeros(BINS)
            dense[np.asarray(bins, dtype=np.int64)] = _numbers(value, key)
            arrays.append(dense)
        evidence = cls(*arrays, judge=judge)
        evidence.check()
        return evidence

    def to_record(self) -> dict[str, Any]:
        """The bins that hold labels and the judge, for the signed global model (small: a
        device's labels sit in a few high-score bins)."""
        held = np.flatnonzero(self.count > 0)
        return {} if not len(held) else {
            RECORD_BINS: held.tolist(),
            **{key: array[held].tolist() for key, array in zip(KEYS, self._arrays(),
                                                                 strict=True)},
            **({JUDGE: self.judge} if self.judge else {})}

    def judged_by(self, judge: str) -> "BoundEvidence":
        """These sums as the labels of ``judge`` (the server names a round's pool)."""
        return replace(self, judge=judge)

    def check(self) -> None:
        """ValueError unless these sums can be those of labels (see the module's
        docstring): what a device claims is checked before it is pooled."""
        c, w, s, x = self._arrays()
        with np.errstate(divide="ignore", invalid="ignore"):
            rules = (
                ("a bin without labels must hold no weight",
                 (c > 0) | ((w == 0) & (s == 0) & (x == 0))),
                (f"a bin's weight must lie between its count and {MAX_WEIGHT:g} times it",
                 (w >= c * (1 - _SLACK)) & (w <= c * MAX_WEIGHT * (1 + _SLACK))),
                (f"a bin's squared weights must lie between weight²/count and "
                 f"{MAX_WEIGHT:g} times its weight",
                 (c == 0) | ((s >= np.where(c > 0, w * w / c, 0) * (1 - _SLACK))
                             & (s <= w * MAX_WEIGHT * (1 + _SLACK)))),
                ("a bin's wrong weight must not exceed its weight", x <= w * (1 + _SLACK)))
        for why, holds in rules:
            bad = np.flatnonzero(~holds)
            if len(bad):
                raise ValueError(f"its bound evidence is inconsistent: {why} (bin {bad[0]})")

    def _arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        return self.count, self.weight, self.squares, self.wrong

    @property
    def labels(self) -> int:
        return int(round(float(self.count.sum())))

    def __add__(self, other: "BoundEvidence") -> "BoundEvidence":
        if self.judge and other.judge and self.judge != other.judge:
            raise ValueError("the labels of two judges do not add up: their scores lie on "
                             "different scales")
        return BoundEvidence(*(a + b for a, b in zip(self._arrays(), other._arrays(),
                                                      strict=True)),
                             judge=self.judge or other.judge)

    def at_most(self, labels: float) -> "BoundEvidence":
        """Scaled down to ``labels`` labels in all (every sum by the same factor, so the
        error share stays and Kish's effective size shrinks in proportion): no device's
        evidence weighs more than screening allows."""
        total = float(self.count.sum())
        if total <= labels:
            return self
        scale = max(labels, 0.0) / total
        return BoundEvidence(*(a * scale for a in self._arrays()), judge=self.judge)

    def rows(self) -> tuple[np.ndarray, ...]:
        """(score, count, weight, squares, wrong) of the bins that hold labels, a bin at
        its lower edge: what client.learning.bound merges with a device's own labels."""
        held = np.flatnonzero(self.count > 0)
        return (edges()[held], *(a[held] for a in self._arrays()))


def round_pool(published: BoundEvidence, sums: Iterable[BoundEvidence], judge: str
               ) -> BoundEvidence:
    """What a round publishes for one judge: the sum of its devices' (screened, capped)
    ``sums``, named by the round's ``judge``; each device sends all of its labels every
    time, so it replaces the ``published`` pool, which a round without labels keeps."""
    pooled = sum(sums, BoundEvidence.empty())
    return pooled.judged_by(judge) if pooled.labels else published


def _numbers(value: list[Any], key: str) -> np.ndarray:
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in value):
        raise ValueError(f"its bound evidence is malformed: '{key}' must hold numbers")
    array = np.asarray(value, dtype=np.float64)
    if not (np.isfinite(array).all() and (array >= 0).all()):
        raise ValueError(f"its bound evidence is malformed: '{key}' must hold finite "
                         "numbers >= 0")
    return array

