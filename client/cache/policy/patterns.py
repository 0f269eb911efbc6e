"""SCALM's semantic patterns: the queries asked (the policy's query log) clustered per
conversation round, each pattern ranked by its token saving ratio, the share of its
tokens that repeats of earlier queries (what a cache can serve) account for.

CO-HSC clusters every round on its own into ``patterns`` groups. SE-HSC clusters round 1
into ``patterns`` groups and each later round only inside parents that survive pruning
(a parent whose token saving ratio is already >= ``prune_saving`` or whose share of its
round's queries is <= ``prune_share`` keeps its later rounds as one pattern), into
ceil(patterns / round) groups. A query's parent is the previous round's pattern nearest
to its context (the previous query). k-means is the fast option, DBSCAN the paper's.
"""

import math
from dataclasses import dataclass

import numpy as np

RANKS = ("high", "mid", "low")
RANK_PRIORITY = {"high": 3, "mid": 2, "low": 1}  # SCALM's starting LFU priority
_RANK_SHARES = (0.25, 0.5, 0.75)  # high / mid / low = top 25% / 50% / 75% of patterns


@dataclass(frozen=True)
class PatternInput:
    """What clustering needs of the queries asked, row i describing query (or entry) i."""

    vectors: np.ndarray  # (n, dim) unit query embeddings
    contexts: np.ndarray  # (n, dim) unit embeddings of the previous query; zeros in round 1
    rounds: np.ndarray  # (n,) 0 for a first turn, 1 for a follow-up, ...
    tokens: np.ndarray  # (n,) tokens one answer costs: query + answer + context
    asked: np.ndarray  # (n,) times it was asked
    hits: np.ndarray  # (n,) times of those a cache would serve it (a repeat)


@dataclass(frozen=True)
class PatternModel:
    """Fitted patterns: a unit centroid, a round, a token saving ratio and a rank each."""

    centroids: np.ndarray  # (p, dim) float32
    rounds: np.ndarray  # (p,) int
    ratios: np.ndarray  # (p,) float: tokens saved / tokens asked
    ranks: tuple[str | None, ...]  # "high" / "mid" / "low", None below the top 75%
    labels: np.ndarray  # (n,) the pattern of each fitted entry

    def __len__(self) -> int:
        return len(self.rounds)

    @property
    def has_savings(self) -> bool:
        """Whether any pattern has saved tokens yet (without that, ranks say nothing)."""
        return bool((self.ratios > 0).any())

    def nearest(self, vector: np.ndarray, round_: int) -> int | None:
        """The pattern of a new query: the nearest centroid of its round (the deepest
        clustered round for deeper queries); O(patterns)."""
        if not len(self):
            return None
        same = np.flatnonzero(self.rounds == min(round_, int(self.rounds.max())))
        if not len(same):
            return None
        scores = self.centroids[same] @ vector.astype(np.float32, copy=False)
        return int(same[int(np.argmax(scores))])

    def priority(self, pattern: int | None) -> int:
        """SCALM's starting priority of an entry in ``pattern``: 3 / 2 / 1 by rank, else 0."""
        rank = None if pattern is None else self.ranks[pattern]
        return RANK_PRIORITY.get(rank, 0) if rank is not None else 0


def token_saving_ratios(labels: np.ndarray, hits: np.ndarray, asked: np.ndarray,
                        tokens: np.ndarray, count: int) -> np.ndarray:
    """Per pattern: tokens of its hits over the tokens of all its queries."""
    saved = np.bincount(labels, weights=hits * tokens, minlength=count)
    spent = np.bincount(labels, weights=asked * tokens, minlength=count)
    return np.divide(saved, spent, out=np.zeros(count), where=spent > 0)


def rank_patterns(ratios: np.ndarray) -> tuple[str | None, ...]:
    """High / mid / low for the top 25% / 50% / 75% by ratio; tied patterns share the lower
    rank, so a crowd of patterns that saved nothing is never ranked high."""
    count = len(ratios)
    ranks: list[str | None] = []
    for ratio in ratios:
        position = int((ratios >= ratio).sum()) / count
        ranks.append(next((r for r, share in zip(RANKS, _RANK_SHARES, strict=True)
                           if position <= share), None))
    return tuple(ranks)


def _cluster(vectors: np.ndarray, groups: int, method: str, eps: float, seed: int
             ) -> np.ndarray:
    """Labels 0..g-1 of ``vectors``. DBSCAN's noise points become patterns of their own.
    (scikit-learn is imported here, when patterns are mined, not by every lookup.)"""
    from sklearn.cluster import DBSCAN, KMeans

    if len(vectors) <= 1 or groups <= 1:
        return np.zeros(len(vectors), dtype=np.int64)
    if method == "kmeans":
        k = min(groups, len(np.unique(vectors, axis=0)))  # repeats are one point
        return KMeans(n_clusters=k, n_init=1, random_state=seed).fit_predict(vectors)
    labels = DBSCAN(eps=eps, min_samples=2, metric="cosine").fit_predict(vectors)
    noise = np.flatnonzero(labels < 0)
    labels[noise] = labels.max() + 1 + np.arange(len(noise))
    return labels


def _centroid(vectors: np.ndarray) -> np.ndarray:
    mean = vectors.mean(axis=0)
    norm = float(np.linalg.norm(mean))
    return (mean / norm if norm > 0 else mean).astype(np.float32)


class _Builder:
    """Collects patterns as they are found, round by round."""

    def __init__(self, data: PatternInput) -> None:
        self.data = data
        self.labels = np.full(len(data.rounds), -1, dtype=np.int64)
        self.centroids: list[np.ndarray] = []
        self.rounds: list[int] = []

    def add(self, rows: np.ndarray, labels: np.ndarray, round_: int) -> list[int]:
        """Make one pattern per distinct label among ``rows``; returns their ids."""
        made: list[int] = []
        for label in np.unique(labels):
            members = rows[labels == label]
            self.labels[members] = len(self.rounds)
            made.append(len(self.rounds))
            self.centroids.append(_centroid(self.data.vectors[members]))
            self.rounds.append(round_)
        return made

    def ratios(self) -> np.ndarray:
        done = self.labels >= 0
        return token_saving_ratios(self.labels[done], self.data.hits[done],
                                   self.data.asked[done], self.data.tokens[done],
                                   len(self.rounds))

    def shares(self, made: list[int]) -> np.ndarray:
        """Each pattern in ``made``: its share of the queries asked in all of ``made``."""
        done = self.labels >= 0
        asked = np.bincount(self.labels[done], weights=self.data.asked[done],
                            minlength=len(self.rounds))[made]
        return asked / asked.sum()

    def model(self) -> PatternModel:
        ratios = self.ratios()
        return PatternModel(np.stack(self.centroids), np.asarray(self.rounds), ratios,
                            rank_patterns(ratios), self.labels)


def fit_co_hsc(data: PatternInput, patterns: int = 20, method: str = "kmeans",
               eps: float = 0.3, seed: int = 0) -> PatternModel:
    """CO-HSC: each round clustered on its own into ``patterns`` groups."""
    builder = _Builder(data)
    for round_ in np.unique(data.rounds):
        rows = np.flatnonzero(data.rounds == round_)
        builder.add(rows, _cluster(data.vectors[rows], patterns, method, eps, seed), int(round_))
    return builder.model()


def fit_se_hsc(data: PatternInput, patterns: int = 20, method: str = "kmeans",
               eps: float = 0.3, seed: int = 0, prune_saving: float = 0.2,
               prune_share: float = 0.05) -> PatternModel:
    """SE-HSC: round 1 into ``patterns`` groups, later rounds inside surviving parents."""
    builder = _Builder(data)
    level: list[int] = []  # the patterns of the previous round
    splits: dict[int, bool] = {}  # pattern -> may its next round be split
    for round_ in range(int(data.rounds.max(initial=0)) + 1):
        rows = np.flatnonzero(data.rounds == round_)
        if not len(rows):
            level = []
            continue
        if not level:  # round 1 (or a round after a gap): clustered on its own
            made = builder.add(rows, _cluster(data.vectors[rows], patterns, method, eps, seed),
                               round_)
            parent_split = dict.fromkeys(made, True)
        else:
            centroids = np.stack([builder.centroids[p] for p in level])
            parent_of = np.asarray(level)[np.argmax(data.contexts[rows] @ centroids.T, axis=1)]
            made, parent_split = [], {}
            for parent in np.unique(parent_of):
                members = rows[parent_of == parent]
                groups = math.ceil(patterns / (round_ + 1)) if splits[int(parent)] else 1
                children = builder.add(members, _cluster(data.vectors[members], groups, method,
                                                         eps, seed), round_)
                made.extend(children)
                parent_split.update(dict.fromkeys(children, splits[int(parent)]))
        ratios, shares = builder.ratios(), builder.shares(made)
        for pattern, share in zip(made, shares, strict=True):
            pruned = ratios[pattern] >= prune_saving or share <= prune_share
            splits[pattern] = parent_split[pattern] and not pruned
        level = made
    return builder.model()
