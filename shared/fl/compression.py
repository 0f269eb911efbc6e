"""Small updates: what a device sends is its update (trained minus global weights),
quantised blockwise to 8 or 4 bits, not its float32 weights.

Each tensor's update is cut into blocks of BLOCK consecutive values (a block never spans
two rows of a 384- or 768-wide matrix); a block keeps one float32 scale, max|update| /
QMAX, and its values as round(update / scale), so each decoded value is within half a
step (scale / 2) of the float one. 8 bits: one int8 a value; 4 bits: two values a byte
(an offset nibble, 1..15). The server decodes a reply into global + update before it
screens it (fl_server.screening), so clipping, FedAvg and DP act on full weights as with
float replies; the mean of decoded updates is within the mean of the devices' half
steps of the mean of the float ones.

Per value: 1 byte (8 bits) or 1/2 byte (4 bits), plus 4 / BLOCK for the scale: about a
quarter (an eighth) of float32.
"""

import math
from collections.abc import Mapping

import numpy as np

BLOCK = 64
BITS = (8, 4)
_VALUES = ":q"  # suffixes of a compressed tensor's two arrays
_SCALES = ":scale"


def _qmax(bits: int) -> int:
    return 2 ** (bits - 1) - 1


def _blocks(size: int) -> int:
    return math.ceil(size / BLOCK)


def encode_update(trained: Mapping[str, np.ndarray], sent: Mapping[str, np.ndarray],
                  bits: int) -> dict[str, np.ndarray]:
    """The update of ``trained`` from the weights ``sent``, quantised to ``bits`` bits:
    two arrays per tensor (``name:q`` and ``name:scale``)."""
    if bits not in BITS:
        raise ValueError(f"updates are quantised to one of {BITS} bits, not {bits}")
    out: dict[str, np.ndarray] = {}
    for name, weights in sent.items():
        update = (np.asarray(trained[name], np.float64) - np.asarray(weights, np.float64)
                  ).ravel()
        padded = np.zeros(_blocks(update.size) * BLOCK)
        padded[:update.size] = update
        blocks = padded.reshape(-1, BLOCK)
        scale = (np.abs(blocks).max(axis=1) / _qmax(bits)).astype(np.float32)
        safe = np.where(scale > 0, scale, 1.0).astype(np.float64)[:, None]
        q = np.clip(np.rint(blocks / safe), -_qmax(bits), _qmax(bits)).astype(np.int8).ravel()
        if bits == 4:
            nibbles = (q + 8).astype(np.uint8)
            q = nibbles[0::2] | (nibbles[1::2] << 4)
        out[name + _VALUES] = q
        out[name + _SCALES] = scale
    return out


def is_compressed(names: object) -> bool:
    return any(str(name).endswith(_SCALES) for name in names)  # type: ignore[attr-defined]


def decode_update(arrays: Mapping[str, np.ndarray], sent: Mapping[str, np.ndarray]
                  ) -> dict[str, np.ndarray]:
    """``sent`` plus the decoded update, in ``sent``'s dtypes and shapes. ValueError,
    naming the tensor, when ``arrays`` is not an encoding of an update of ``sent``
    (other names, lengths or types, non-finite or negative scales)."""
    expected = {name + suffix for name in sent for suffix in (_VALUES, _SCALES)}
    if set(arrays) != expected:
        raise ValueError("its compressed update is not of the global model's tensors")
    out: dict[str, np.ndarray] = {}
    for name, weights in sent.items():
        q, scale = np.asarray(arrays[name + _VALUES]), np.asarray(arrays[name + _SCALES])
        blocks = _blocks(weights.size)
        if scale.dtype != np.float32 or scale.shape != (blocks,):
            raise ValueError(f"its compressed update has malformed scales ({name})")
        if not np.isfinite(scale).all() or (scale < 0).any():
            raise ValueError(f"its compressed update has non-finite or negative scales "
                             f"({name})")
        if q.dtype == np.int8 and q.shape == (blocks * BLOCK,):
            values = q.astype(np.float64)
        elif q.dtype == np.uint8 and q.shape == (blocks * BLOCK // 2,):
            values = np.empty(blocks * BLOCK)
            values[0::2] = (q & 0x0F).astype(np.float64) - 8
            values[1::2] = (q >> 4).astype(np.float64) - 8
        else:
            raise ValueError(f"its compressed update has malformed values ({name})")
        update = (values.reshape(blocks, BLOCK) * scale.astype(np.float64)[:, None]
                  ).ravel()[:weights.size].reshape(weights.shape)
        out[name] = (np.asarray(weights, np.float64) + update).astype(weights.dtype)
    return out


def steps(arrays: Mapping[str, np.ndarray], name: str, size: int) -> np.ndarray:
    """The quantisation step (its block's scale) of each of the ``size`` values of tensor
    ``name`` in a compressed ``arrays``: half of it bounds each value's decoding error."""
    return np.repeat(np.asarray(arrays[name + _SCALES], np.float64), BLOCK)[:size]


def compressed_bytes(sizes: Mapping[str, int], bits: int) -> int:
    """Bytes of the encoded values and scales of tensors of these sizes (without the
    record's per-array framing)."""
    return sum(_blocks(n) * (BLOCK * bits // 8 + 4) for n in sizes.values())
