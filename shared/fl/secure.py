"""What both sides of a SecAgg+ round (fl_server.secure_rounds, client.fl.secure) agree
on beyond Flower's protocol: Flower's legacy messages carry unnamed weight lists and
scalar metrics only, so the tensors' names travel in the fit config (in the order of the
list) and the evidence histograms (shared.fl.evidence, shared.fl.bound_evidence) as JSON
text."""

import hashlib
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from meancache.shared.fl.bound_evidence import COSINE_KEYS
from meancache.shared.fl.bound_evidence import KEYS as BOUND_KEYS
from meancache.shared.fl.evidence import KEYS as SIMILARITY_KEYS

KEYS = (*SIMILARITY_KEYS, *BOUND_KEYS, *COSINE_KEYS)  # the lists a reply's metrics hold

NAMES = "tensor-names"  # fit-config key: the weights' names, one a line, in list order
SECURE = "secure-aggregation"  # fit-config key: this round is SecAgg+ (no quantised update)


def to_scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Metrics with each histogram as JSON text."""
    return {k: json.dumps(list(v)) if k in KEYS else v for k, v in metrics.items()}


def from_scalars(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """The histograms read back (ValueError for one that is not a JSON list; its
    numbers are checked by shared.fl.evidence and shared.fl.bound_evidence)."""
    out = dict(metrics)
    for key in KEYS:
        if key in out:
            try:
                value = json.loads(str(out[key]))
            except ValueError:
                raise ValueError(f"'{key}' is not a JSON list") from None
            out[key] = value
    return out


# A SecAgg+ device sends only part of its weights when they would not fit the upload cap:
# the same entries on every device, drawn afresh each round, so that the masked sum is the
# exact sum of what was sent (a linear compression, which SecAgg+ needs; the quantised
# low-rank updates of plain rounds are not linear). The server keeps last round's value
# everywhere else.
SKETCH_SHARE = "sketch-share"  # fit-config key: the share of a large tensor's entries sent
SKETCH_SEED = "sketch-seed"  # fit-config key: which entries (a new seed each round)
MASKED_BYTES = 8  # Flower's SecAgg+ sends each masked entry as an int64
WHOLE = 1024  # a tensor of at most this many entries (a bias, a norm) is always sent whole
_GOLDEN, _MIX1, _MIX2 = 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB


def sketch_share(sizes: Sequence[int], upload_bytes: float) -> float:
    """The share of each large tensor's entries that keeps the masked weights within
    ``upload_bytes`` (0: no cap), the small tensors sent whole; 1.0 where all fit. A
    ValueError where the small tensors alone do not fit."""
    small = sum(s for s in sizes if s <= WHOLE)
    large = sum(s for s in sizes if s > WHOLE)
    if upload_bytes <= 0 or MASKED_BYTES * (small + large) <= upload_bytes:
        return 1.0
    room = upload_bytes / MASKED_BYTES - small
    if room <= 0:
        raise ValueError(f"an upload cap of {upload_bytes / 1e6:.3f} MB does not hold "
                         f"the {small} entries of the small tensors alone")
    return room / large


def sketch_entries(size: int, share: float, seed: int, name: str) -> np.ndarray | None:
    """Which of the ``size`` entries of the tensor called ``name`` are sent this round
    (sorted positions, ``floor(share * size)`` of them), or None for all of it. The
    entries with the smallest splitmix64 hashes of the seed, the name and the position, in
    numpy's wrapping uint64 arithmetic: every device and the server pick the same ones,
    with no random generator whose stream a numpy version could change (the hash is a
    bijection of the position, so there are no ties)."""
    if share >= 1 or size <= WHOLE:
        return None
    tensor = int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")
    start = (seed * _GOLDEN + tensor) % 2**64
    z = np.arange(size, dtype=np.uint64) * np.uint64(_GOLDEN) + np.uint64(start)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(_MIX1)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(_MIX2)
    z ^= z >> np.uint64(31)
    count = int(share * size)
    return np.sort(np.argpartition(z, count)[:count]) if count else np.empty(0, np.int64)
