"""PCA compression of embeddings, as an extra projection layer of the encoder (MeanCache).

Fitted with scikit-learn on the user's own cached query embeddings; stored as
safetensors so that it can travel with a model (FL) and be hashed into a version id.
Plain NumPy: a lookup projects with it without importing torch (the PyTorch pipeline
wraps the same arrays, ``shared.encoder.pipeline``).
"""

import hashlib
from functools import cached_property
from pathlib import Path

import numpy as np
from meancache.shared.files import atomic_path
from safetensors.numpy import load_file, save_file

DEFAULT_PCA_DIMS = 64  # MeanCache's compressed embedding size


class PCAProjection:
    """y = (x - mean) @ components.T: the top principal directions of the fitted embeddings."""

    def __init__(self, components: np.ndarray, mean: np.ndarray) -> None:
        if components.ndim != 2 or mean.shape != (components.shape[1],):
            raise ValueError("PCA components must be (k, d) and mean (d,)")
        # sklearn's components_ are column-major: make them C-ordered, or save_file would
        # write the raw buffer in the wrong order. Own read-only copies: the version below
        # is hashed once, so the arrays must not change under it.
        self.components = np.array(components, dtype=np.float32, order="C")
        self.mean = np.array(mean, dtype=np.float32, order="C")
        self.components.flags.writeable = False
        self.mean.flags.writeable = False

    @property
    def in_dim(self) -> int:
        return int(self.components.shape[1])

    @property
    def out_dim(self) -> int:
        return int(self.components.shape[0])

    def project(self, x: np.ndarray) -> np.ndarray:
        """(n, in_dim) vectors that are already embedded, projected to (n, out_dim)."""
        return (x - self.mean) @ self.components.T

    @cached_property
    def version(self) -> str:
        """The layer's id, hashed once: every lookup names its vector space (0.13 ms a hash
        of a 64 x 768 layer, four times a lookup)."""
        digest = hashlib.sha256()
        digest.update(self.components.tobytes())
        digest.update(self.mean.tobytes())
        return digest.hexdigest()[:16]

    @classmethod
    def fit(cls, embeddings: np.ndarray, dims: int = DEFAULT_PCA_DIMS) -> "PCAProjection":
        """Fit on (n, d) embeddings; needs at least ``dims`` of them."""
        from sklearn.decomposition import PCA

        n, d = embeddings.shape
        if n < dims or d < dims:
            raise ValueError(f"PCA to {dims} dimensions needs at least {dims} embeddings of "
                             f"at least {dims} dimensions, got {n} of {d}")
        pca = PCA(n_components=dims, svd_solver="full", random_state=0)
        pca.fit(embeddings.astype(np.float64))
        return cls(pca.components_.astype(np.float32), pca.mean_.astype(np.float32))

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as partial:
            save_file({"components": self.components, "mean": self.mean},
                      str(partial))

    @classmethod
    def load(cls, path: Path) -> "PCAProjection":
        tensors = load_file(str(path))
        return cls(tensors["components"], tensors["mean"])


def neighbour_similarities(
    before: np.ndarray, after: np.ndarray, k: int = 5, sample: int = 2000
) -> tuple[np.ndarray, np.ndarray]:
    """Cosines of each vector's k nearest neighbours in two spaces (same rows, unit vectors).

    These pairs are what a threshold separates, so they are what a threshold is carried
    from one space to the other with (see shared.threshold.transfer_threshold).
    """
    rng = np.random.default_rng(0)
    rows = np.arange(len(before))
    if len(rows) > sample:
        rows = rng.choice(len(rows), sample, replace=False)
    a, b = before[rows], after[rows]
    k = min(k, len(rows) - 1)
    sims = a @ a.T
    np.fill_diagonal(sims, -np.inf)
    neighbours = np.argpartition(-sims, k - 1, axis=1)[:, :k]
    i = np.repeat(np.arange(len(rows)), k)
    j = neighbours.ravel()
    return sims[i, j], (b[i] * b[j]).sum(1)
