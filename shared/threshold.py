"""Threshold math: scores of a similarity threshold on labelled pairs, and the best one.

MeanCache picks tau by maximising F-beta with beta = 0.5, because a false hit (a wrong
answer served from cache) costs the user more than a miss (a slower, correct answer).
"""

from dataclasses import asdict, dataclass

import numpy as np

BETA = 0.5

# Best F0.5 threshold of the packaged all-MiniLM-L6-v2 (full 384-d embeddings) on all
# 54,514 train pairs of ../shared/data/qqp/pairs.jsonl (benchmarks/match_quality.py
# --train-pairs 54514: 0.8692; dev F0.5 0.671).
DEFAULT_THRESHOLD = 0.869
# Best F0.5 threshold of all-mpnet-base-v2 (the "mpnet" profile, full 768-d) on 10,000
# train pairs (benchmarks/match_quality.py --encoder mpnet: 0.8760; dev F0.5 0.703).
MPNET_THRESHOLD = 0.876


def check_threshold(value: object) -> float:
    """``value`` as a cosine threshold, or ValueError: only 0 < tau < 1 separates anything
    (tau <= 0 serves every cached answer, tau >= 1 none but exact repeats)."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 < value < 1.0:
        raise ValueError(f"a similarity threshold must lie strictly between 0 and 1, "
                         f"not {value!r}")
    return float(value)


def nearest_threshold(value: float) -> float:
    """The valid threshold closest to a computed one (tuning or carrying tau may land on
    or beyond 0 or 1)."""
    return float(np.clip(value, 0.001, 0.999))


@dataclass(frozen=True)
class MatchScores:
    """Quality of the decision "similarity >= threshold means duplicate"."""

    threshold: float
    precision: float
    recall: float
    f1: float
    f05: float
    accuracy: float
    pairs: int

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self)


def _fbeta(precision: np.ndarray, recall: np.ndarray, beta: float) -> np.ndarray:
    b2 = beta * beta
    denom = b2 * precision + recall
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(denom > 0, (1 + b2) * precision * recall / denom, 0.0)


def score_thresholds(
    similarities: np.ndarray, labels: np.ndarray, thresholds: np.ndarray
) -> list[MatchScores]:
    """Scores of each threshold on the pairs (label 1 = duplicate)."""
    sims = np.asarray(similarities, dtype=np.float64)
    labs = np.asarray(labels).astype(bool)
    ths = np.asarray(thresholds, dtype=np.float64)
    if sims.shape != labs.shape:
        raise ValueError("similarities and labels differ in length")
    predicted = sims[None, :] >= ths[:, None]
    tp = (predicted & labs).sum(1)
    fp = (predicted & ~labs).sum(1)
    fn = (~predicted & labs).sum(1)
    tn = (~predicted & ~labs).sum(1)
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        recall = np.where(tp + fn > 0, tp / (tp + fn), 0.0)
    f1 = _fbeta(precision, recall, 1.0)
    f05 = _fbeta(precision, recall, BETA)
    n = len(sims)
    accuracy = (tp + tn) / n if n else np.zeros_like(ths)
    return [
        MatchScores(float(t), float(p), float(r), float(a), float(b), float(c), n)
        for t, p, r, a, b, c in zip(ths, precision, recall, f1, f05, accuracy, strict=True)
    ]


def best_threshold(
    similarities: np.ndarray, labels: np.ndarray, beta: float = BETA
) -> MatchScores:
    """The threshold that maximises F-beta over the pairs (ties go to the higher one).

    Candidates are midpoints between consecutive distinct similarities, so the chosen
    threshold separates the observed pairs instead of sitting exactly on one of them.
    One sort and two cumulative sums: fine for the 64K-pair QQP file.
    """
    sims = np.asarray(similarities, dtype=np.float64)
    labs = np.asarray(labels).astype(bool)
    if sims.size == 0:
        raise ValueError("no pairs to tune a threshold on")
    order = np.argsort(-sims, kind="stable")
    s, lab = sims[order], labs[order]
    # Cut after each run of equal similarities: predicting "duplicate" for s[: k + 1].
    last_of_run = np.r_[s[1:] != s[:-1], True]
    tp = np.cumsum(lab)[last_of_run]
    fp = np.cumsum(~lab)[last_of_run]
    cut_sims = s[last_of_run]
    below = np.r_[cut_sims[1:], cut_sims[-1] - 2e-6]
    thresholds = np.r_[cut_sims[0] + 1e-6, (cut_sims + below) / 2]
    tp = np.r_[0, tp]
    fp = np.r_[0, fp]
    positives = labs.sum()
    with np.errstate(divide="ignore", invalid="ignore"):
        precision = np.where(tp + fp > 0, tp / (tp + fp), 0.0)
        recall = tp / positives if positives else np.zeros_like(tp, dtype=np.float64)
    f = _fbeta(precision, recall, beta)
    best = int(np.flatnonzero(f == f.max())[0])  # thresholds descend: first = highest
    return score_thresholds(sims, labs, np.array([thresholds[best]]))[0]


def transfer_threshold(threshold: float, sims_from: np.ndarray, sims_to: np.ndarray) -> float:
    """Carry a threshold from one vector space into another (e.g. full -> PCA).

    ``sims_from`` and ``sims_to`` are the similarities of the same query pairs in the two
    spaces (near neighbours, so that many lie close to the threshold). A least-squares
    line through the pairs near the threshold maps it across; unlabelled data suffices.
    With fewer than 20 pairs near the threshold it stays as it is; the result stays a
    valid threshold (see ``check_threshold``).
    """
    sims_from = np.asarray(sims_from, dtype=np.float64)
    sims_to = np.asarray(sims_to, dtype=np.float64)
    near = np.abs(sims_from - threshold) <= 0.15
    if near.sum() < 20 or np.ptp(sims_from[near]) == 0:
        return threshold  # too few pairs near tau to say how the space moved it
    slope, intercept = np.polyfit(sims_from[near], sims_to[near], 1)
    return nearest_threshold(slope * threshold + intercept)
