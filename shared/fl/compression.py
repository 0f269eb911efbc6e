"""Small updates: what a device sends is its update (trained minus global weights),
quantised blockwise to 8 or 4 bits, not its float32 weights; with a rank r > 0, each
matrix's update travels as its two rank-r factors (shared.fl.low_rank), quantised alike.

Each row of values is cut into blocks of BLOCK consecutive values (a block never spans
two rows of a factor, nor two rows of a 384- or 768-wide matrix); a block keeps one
float32 scale, max|value| / QMAX, and its values as round(value / scale), so each decoded
value is within half a step (scale / 2) of the float one. 8 bits: one int8 a value;
4 bits: two values a byte (an offset nibble, 1..15). A whole tensor's update is one row
(arrays ``name:q`` and ``name:scale``, flat); a factored one is two factors of r rows
(``name:u:q``, ``name:u:scale``, ``name:v:q``, ``name:v:scale``, 2-D, r read from
them). The server decodes a reply into global + update before it screens it
(fl_server.screening), so clipping, FedAvg and DP act on full weights as with float
replies; the mean of decoded updates is within the mean of the devices' half steps of
the mean of the float ones (of their rank-r approximations, where factored).

Per value: 1 byte (8 bits) or 1/2 byte (4 bits), plus 4 / BLOCK for the scale: about a
quarter (an eighth) of float32; a factored m x n matrix sends r (m + n) values.
"""

import math
from collections.abc import Mapping

import numpy as np
from meancache.shared.fl.low_rank import factored, factorise

BLOCK = 64
BITS = (8, 4)
_VALUES = ":q"  # suffixes of a compressed tensor's two arrays
_SCALES = ":scale"
FACTORS = (":u", ":v")  # a factored update is u.T @ v


def _qmax(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def _blocks(size: int) -> int:
    return math.ceil(size / BLOCK)


def _quantise(rows: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(values, scales) of a (k, n) float array, blocks within rows: (k, n padded to
    whole blocks) int8, or half as many uint8 pairs of nibbles, and (k, blocks) float32."""
    padded = np.zeros((rows.shape[0], _blocks(rows.shape[1]) * BLOCK))
    padded[:, :rows.shape[1]] = rows
    blocks = padded.reshape(rows.shape[0], -1, BLOCK)
    scale = (np.abs(blocks).max(axis=2) / _qmax(bits)).astype(np.float32)
    safe = np.where(scale > 0, scale, 1.0).astype(np.float64)[..., None]
    q = np.clip(np.rint(blocks / safe), -_qmax(bits), _qmax(bits)).astype(np.int8)
    q = q.reshape(rows.shape[0], -1)
    if bits == 4:
        nibbles = (q + 8).astype(np.uint8)
        q = nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)
    return q, scale


def _dequantise(q: np.ndarray, scale: np.ndarray, lead: tuple[int, ...], size: int,
                what: str) -> np.ndarray:
    """The (rows, size) float64 values of an encoded row set whose arrays have the leading
    shape ``lead`` (``()``: one flat row; ``(r,)``: r rows). ValueError naming ``what``."""
    blocks = _blocks(size)
    if scale.dtype != np.float32 or scale.shape != (*lead, blocks):
        raise ValueError(f"its compressed update has malformed scales ({what})")
    if not np.isfinite(scale).all() or (scale < 0).any():
        raise ValueError(f"its compressed update has non-finite or negative scales ({what})")
    rows = lead[0] if lead else 1
    if q.dtype == np.int8 and q.shape == (*lead, blocks * BLOCK):
        values = q.reshape(rows, -1).astype(np.float64)
    elif q.dtype == np.uint8 and q.shape == (*lead, blocks * BLOCK // 2):
        packed = q.reshape(rows, -1)
        values = np.empty((rows, blocks * BLOCK))
        values[:, 0::2] = (packed & 0x0F).astype(np.float64) - 8
        values[:, 1::2] = (packed >> 4).astype(np.float64) - 8
    else:
        raise ValueError(f"its compressed update has malformed values ({what})")
    scaled = values.reshape(rows, blocks, BLOCK) * scale.astype(np.float64).reshape(
        rows, blocks, 1)
    return scaled.reshape(rows, -1)[:, :size]


def encoded_names(name: str, shape: tuple[int, ...], rank: int) -> list[str]:
    """The arrays that encode the update of tensor ``name`` of ``shape``."""
    parts = FACTORS if factored(shape, rank) else ("",)
    return [name + part + suffix for part in parts for suffix in (_VALUES, _SCALES)]


def encode_update(trained: Mapping[str, np.ndarray], sent: Mapping[str, np.ndarray],
                  bits: int, rank: int = 0) -> dict[str, np.ndarray]:
    """The update of ``trained`` from the weights ``sent``, quantised to ``bits`` bits:
    ``name:q`` and ``name:scale`` per tensor, or, for a matrix that ``rank`` > 0 factors
    (shared.fl.low_rank.factored), its rank-``rank`` factors' four arrays."""
    if bits not in BITS:
        raise ValueError(f"updates are quantised to one of {BITS} bits, not {bits}")
    out: dict[str, np.ndarray] = {}
    for name, weights in sent.items():
        update = np.asarray(trained[name], np.float64) - np.asarray(weights, np.float64)
        if factored(update.shape, rank):
            for part, factor in zip(FACTORS, factorise(update, rank), strict=True):
                out[name + part + _VALUES], out[name + part + _SCALES] = _quantise(factor, bits)
        else:
            q, scale = _quantise(update.reshape(1, -1), bits)
            out[name + _VALUES], out[name + _SCALES] = q.ravel(), scale.ravel()
    return out


def is_compressed(names: object) -> bool:
    return any(str(name).endswith(_SCALES) for name in names)  # type: ignore[attr-defined]


def factors(arrays: Mapping[str, np.ndarray], name: str, shape: tuple[int, ...],
            max_rank: int) -> tuple[np.ndarray, np.ndarray]:
    """The decoded factors (u, v) of matrix ``name`` of ``shape``, of a rank between 1 and
    ``max_rank``; ValueError naming the tensor otherwise."""
    scales = np.asarray(arrays[name + FACTORS[0] + _SCALES])
    rank = scales.shape[0] if scales.ndim == 2 else 0
    if not 1 <= rank <= max_rank:
        raise ValueError(f"its low-rank update of {name} has rank {rank}, not between 1 "
                         f"and the run's update-rank {max_rank}")
    return tuple(  # type: ignore[return-value]
        _dequantise(np.asarray(arrays[name + part + _VALUES]),
                    np.asarray(arrays[name + part + _SCALES]), (rank,), size, name + part)
        for part, size in zip(FACTORS, shape, strict=True))


def decode_update(arrays: Mapping[str, np.ndarray], sent: Mapping[str, np.ndarray],
                  max_rank: int = 0) -> dict[str, np.ndarray]:
    """``sent`` plus the decoded update, in ``sent``'s dtypes and shapes. ValueError,
    naming the tensor, when ``arrays`` is not an encoding of an update of ``sent`` at a
    rank of at most ``max_rank`` (other names, lengths or types, non-finite or negative
    scales, factors of another rank)."""
    expected = {a for name, weights in sent.items() for a in encoded_names(name, weights.shape,
                                                                     max_rank)}
    if set(arrays) != expected:
        raise ValueError("its compressed update is not of the global model's tensors")
    out: dict[str, np.ndarray] = {}
    for name, weights in sent.items():
        if factored(weights.shape, max_rank):
            u, v = factors(arrays, name, weights.shape, max_rank)
            update = u.T @ v
        else:
            update = _dequantise(np.asarray(arrays[name + _VALUES]),
                                 np.asarray(arrays[name + _SCALES]), (), weights.size, name)
        out[name] = (np.asarray(weights, np.float64) + update.reshape(weights.shape)
                     ).astype(weights.dtype)
    return out


def steps(arrays: Mapping[str, np.ndarray], name: str, size: int) -> np.ndarray:
    """The quantisation step (its block's scale) of each of the ``size`` values of the
    encoded row set ``name`` (a tensor, or a factor ``tensor:u``) in a compressed
    ``arrays``, in its rows' shape: half of it bounds each value's decoding error."""
    scale = np.asarray(arrays[name + _SCALES], np.float64)
    return np.repeat(scale.reshape(-1, scale.shape[-1]), BLOCK, axis=1)[:, :size].reshape(
        *scale.shape[:-1], size)


def compressed_bytes(shapes: Mapping[str, tuple[int, ...]], bits: int, rank: int = 0) -> int:
    """Bytes of the encoded values and scales of tensors of these shapes (without the
    record's per-array framing): a factored one's rank-``rank`` factors, else its values."""
    def row_bytes(rows: int, size: int) -> int:
        return rows * _blocks(size) * (BLOCK * bits // 8 + 4)

    return sum(sum(row_bytes(rank, n) for n in shape) if factored(shape, rank)
               else row_bytes(1, math.prod(shape)) for shape in shapes.values())

