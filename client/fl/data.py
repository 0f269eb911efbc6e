"""Labelled query pairs a device trains on: its own feedback, or (in simulation) a
partition of the QQP train split, IID or by topic."""

import hashlib
import random
from pathlib import Path

import numpy as np
from meancache.shared.pairs import Pair


def partition(pairs: list[Pair], partition_id: int, num_partitions: int, per_client: int,
              scheme: str = "iid", seed: int = 0, cache_dir: Path | None = None) -> list[Pair]:
    """This client's pairs. ``iid``: a random slice. ``topic``: pairs grouped by a k-means
    clustering of TF-IDF vectors of q1, one cluster (topic) per client."""
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition {partition_id} is not in 0..{num_partitions - 1}")
    if scheme == "iid":
        order = list(range(len(pairs)))
        random.Random(seed).shuffle(order)
        mine = order[partition_id::num_partitions][:per_client]
        return [pairs[i] for i in mine]
    if scheme == "topic":
        labels = _topics(pairs, num_partitions, seed, cache_dir)
        mine = [int(i) for i in np.flatnonzero(labels == partition_id)]
        random.Random(seed + partition_id).shuffle(mine)
        return [pairs[i] for i in mine[:per_client]]
    raise ValueError(f"unknown partitioning {scheme!r} (use 'iid' or 'topic')")


def _topics(pairs: list[Pair], k: int, seed: int, cache_dir: Path | None) -> np.ndarray:
    """Cluster label of every pair; memoised on disk (each simulated client would redo it)."""
    key = hashlib.sha256(f"{len(pairs)}|{pairs[0].q1}|{k}|{seed}".encode()).hexdigest()[:16]
    memo = cache_dir / f"topics-{key}.npy" if cache_dir else None
    if memo is not None and memo.is_file():
        return np.load(memo)
    from sklearn.cluster import MiniBatchKMeans
    from sklearn.feature_extraction.text import TfidfVectorizer

    vectors = TfidfVectorizer(max_features=20000, stop_words="english").fit_transform(
        [p.q1 for p in pairs])
    labels = MiniBatchKMeans(k, random_state=seed, n_init=3).fit_predict(vectors)
    if memo is not None:
        memo.parent.mkdir(parents=True, exist_ok=True)
        np.save(memo, labels)
    return labels


def split(pairs: list[Pair], validation_share: float = 0.2, seed: int = 0
          ) -> tuple[list[Pair], list[Pair]]:
    """Train and validation pairs (the validation pairs tune the local threshold)."""
    order = list(pairs)
    random.Random(seed).shuffle(order)
    cut = int(len(order) * (1 - validation_share))
    return order[:cut], order[cut:]
