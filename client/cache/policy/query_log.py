"""The recent queries SCALM learns its patterns from: every query asked (a hit, or a miss
the upstream answered, stored or not), whether it repeated an earlier one, and its tokens.

Patterns learnt from the stored entries alone could never rank a popular question the
cache has not admitted yet; the log sees it recur. A hit is logged with the served entry's
vector (within tau of the asked one: the lookup path hands over no vector). A ring buffer
of ``capacity`` queries, restarted when the encoder (vector space) changes.
"""

from typing import Any

import numpy as np
from meancache.client.cache.policy.patterns import PatternInput

_DTYPE = np.float16  # as the entries store their vectors


class QueryLog:
    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.version = ""  # the vector space of the logged queries
        self._clear(0)

    def _clear(self, dim: int) -> None:
        self._vectors = np.zeros((self.capacity, dim), dtype=_DTYPE)
        self._contexts = np.zeros((self.capacity, dim), dtype=_DTYPE)
        self._rounds = np.zeros(self.capacity, dtype=np.int64)
        self._tokens = np.zeros(self.capacity, dtype=np.float64)
        self._hits = np.zeros(self.capacity, dtype=np.float64)
        self._size = 0
        self._next = 0

    def __len__(self) -> int:
        return self._size

    def is_repeat(self, vector: np.ndarray, threshold: float, version: str) -> bool:
        """Whether a logged query is as similar as ``threshold`` to ``vector``: O(capacity)."""
        if version != self.version or not self._size:
            return False
        scores = self._vectors[:self._size].astype(np.float32) @ vector.astype(np.float32)
        return bool((scores >= threshold).any())

    def add(self, vector: np.ndarray, context: np.ndarray | None, round_: int, tokens: int,
            hit: bool, version: str) -> None:
        """Log one query; a query in another vector space starts the log afresh."""
        if version != self.version or self._vectors.shape[1] != len(vector):
            self._clear(len(vector))
            self.version = version
        row = self._next
        self._vectors[row] = vector
        self._contexts[row] = 0 if context is None else context
        self._rounds[row], self._tokens[row], self._hits[row] = round_, tokens, float(hit)
        self._next = (row + 1) % self.capacity
        self._size = min(self._size + 1, self.capacity)

    def patterns_input(self) -> PatternInput:
        """A copy of the logged queries for clustering (each asked once)."""
        n = self._size
        return PatternInput(self._vectors[:n].astype(np.float32),
                            self._contexts[:n].astype(np.float32), self._rounds[:n].copy(),
                            self._tokens[:n].copy(), np.ones(n), self._hits[:n].copy())

    def to_record(self) -> dict[str, object]:
        n = self._size
        return {"version": self.version, "dim": int(self._vectors.shape[1]),
                "vectors": self._vectors[:n].tobytes(), "contexts": self._contexts[:n].tobytes(),
                "rounds": self._rounds[:n].tolist(), "tokens": self._tokens[:n].tolist(),
                "hits": self._hits[:n].tolist()}

    @classmethod
    def from_record(cls, record: dict[str, Any], capacity: int) -> "QueryLog":
        log = cls(capacity)
        dim = int(record["dim"])
        vectors = np.frombuffer(record["vectors"], dtype=_DTYPE).reshape(-1, dim)
        contexts = np.frombuffer(record["contexts"], dtype=_DTYPE).reshape(-1, dim)
        rows = zip(vectors, contexts, record["rounds"], record["tokens"], record["hits"],
                   strict=True)
        for vector, context, round_, tokens, hit in list(rows)[-capacity:]:
            log.add(vector, context, int(round_), int(tokens), bool(hit), str(record["version"]))
        return log
