"""In-memory cosine search over the cache's entry vectors.

Vectors are unit length, so cosine similarity is one matrix-vector product. Rows are kept
in a float32 matrix that grows by doubling; removal swaps the last row into the hole.
"""

import numpy as np
from threadpoolctl import ThreadpoolController

# One BLAS thread for the matrix-vector product: on a small machine a second BLAS thread
# fights the encoder's threads and costs more than it gains (benchmarks/lookup_latency.py).
_BLAS = ThreadpoolController()
TIE_DECIMALS = 5  # stored float16 vectors resolve cosines to about 5e-4: closer is a tie


class VectorIndex:
    def __init__(self, dim: int, capacity: int = 1024) -> None:
        self.dim = dim
        self._matrix = np.zeros((capacity, dim), dtype=np.float32)
        self._ids: list[str] = []
        self._row: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._ids)

    def __contains__(self, entry_id: object) -> bool:
        return entry_id in self._row

    @property
    def ids(self) -> list[str]:
        return list(self._ids)

    def vectors(self) -> np.ndarray:
        """A copy of the stored vectors, in the order of ``ids``."""
        return self._matrix[: len(self._ids)].copy()

    def vector(self, entry_id: str) -> np.ndarray:
        """The entry's vector (a view: do not write to it)."""
        return self._matrix[self._row[entry_id]]

    def add(self, entry_id: str, vector: np.ndarray) -> None:
        if vector.shape != (self.dim,):
            raise ValueError(f"vector has shape {vector.shape}, index holds {self.dim}-d vectors")
        if entry_id in self._row:
            self._matrix[self._row[entry_id]] = vector
            return
        n = len(self._ids)
        if n == len(self._matrix):
            grown = np.zeros((max(1024, 2 * n), self.dim), dtype=np.float32)
            grown[:n] = self._matrix[:n]
            self._matrix = grown
        self._matrix[n] = vector
        self._ids.append(entry_id)
        self._row[entry_id] = n

    def add_many(self, entry_ids: list[str], vectors: np.ndarray) -> None:
        for entry_id, vector in zip(entry_ids, vectors, strict=True):
            self.add(entry_id, vector)

    def remove(self, entry_id: str) -> None:
        row = self._row.pop(entry_id, None)
        if row is None:
            return
        last = len(self._ids) - 1
        if row != last:
            moved = self._ids[last]
            self._matrix[row] = self._matrix[last]
            self._ids[row] = moved
            self._row[moved] = row
        self._ids.pop()

    def search(self, query: np.ndarray, k: int = 8, min_score: float = -1.0
               ) -> tuple[list[tuple[str, float]], float | None]:
        """Up to k (id, cosine) pairs with cosine >= min_score, best first, and the best
        cosine of all (None when empty). Only the rows above min_score are ranked."""
        n = len(self._ids)
        if n == 0:
            return [], None
        with _BLAS.limit(limits=1, user_api="blas"):
            scores = self._matrix[:n] @ query.astype(np.float32, copy=False)
        above = np.flatnonzero(scores >= min_score)
        # Equal stored vectors score alike only up to BLAS rounding (which depends on the
        # row's position): ranks compare scores at TIE_DECIMALS, ties keep row order.
        ranked = np.round(scores[above], TIE_DECIMALS)
        if len(above) > k:
            keep = np.argsort(-ranked, kind="stable")[:k]
            above, ranked = above[keep], ranked[keep]
        above = above[np.argsort(-ranked, kind="stable")]
        return [(self._ids[i], float(scores[i])) for i in above], float(scores.max())
