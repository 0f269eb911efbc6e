"""Low-rank updates: a device sends each trained matrix's update as two rank-r factors
(truncated SVD), not its m x n values, so MPNet's layers and the verifier fit the upload
budget (docs/federated-learning.md, "Small updates").

Why a truncated SVD of the update rather than LoRA adapters trained directly: the device
trains as before (the same optimiser, the same clipping, both models' trainers
unchanged), the server decodes every reply back to full weights either way (screening,
FedAvg, the median and DP act on full weights), and of all rank-r matrices the truncated
SVD is the one nearest the trained update (Eckart-Young), so nothing is lost that a
rank-r encoding could keep. Each factor takes the square root of the singular values, so
both hold values of the same size and quantise alike (shared.fl.compression).
"""

import numpy as np


def factored(shape: tuple[int, ...], rank: int) -> bool:
    """Whether a tensor of ``shape`` travels as rank-``rank`` factors: a matrix whose
    factors hold fewer values than it does (vectors, and small or thin matrices such as the
    verifier's 1 x 384 head, travel whole)."""
    if rank <= 0 or len(shape) != 2:
        return False
    rows, cols = shape
    return rank * (rows + cols) < rows * cols


def factorise(update: np.ndarray, rank: int) -> tuple[np.ndarray, np.ndarray]:
    """(u, v), of shapes (rank, m) and (rank, n), with u.T @ v the best rank-``rank``
    approximation of the m x n ``update`` (its truncated SVD)."""
    left, singular, right = np.linalg.svd(np.asarray(update, np.float64), full_matrices=False)
    root = np.sqrt(singular[:rank])[:, None]
    return root * left[:, :rank].T, root * right[:rank]
