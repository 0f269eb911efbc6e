"""How attention (key/value) states are held: the format of the KV cache.

The states are rounded to the format *as the model computes them* (llama.cpp keeps its KV
cache in float16 the same way): a full prefill, a prompt that reads a module or prefix
block back, and a decode step all attend to the same rounded keys and values. So the
store holds exactly what attention read, and reuse stays exact up to float summation
order whatever the format; what a format costs is its distance from float32 states:

- ``float32``: as computed (no rounding).
- ``float16``: 11 significant bits, round to nearest: each element within 2^-11 of its
  value relative (2^-25 absolute below float16's normal range, 2^-14); values beyond
  +-65504 are clamped to it. Half the bytes.
- ``bfloat16``: 8 significant bits (float32's range): within 2^-8 relative. Half the bytes.
- ``int8``: each row (one token's vector in one head) as int8 codes times a float32 scale
  = the row's largest magnitude / 127: each element within scale / 2 of its value. About
  a quarter of the bytes (the scale adds 4 bytes a row).
"""

from dataclasses import dataclass

import torch
from meancache.upstream.precision import KV_FORMATS
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

_FLOAT16_MAX = float(torch.finfo(torch.float16).max)
_SCALE_BYTES = 4  # an int8 row's float32 scale, kept as 4 int8 after its codes


@dataclass(frozen=True)
class KVFormat:
    name: str

    def __post_init__(self) -> None:
        if self.name not in KV_FORMATS:
            raise ValueError(f"unknown KV format {self.name!r}; choose one of "
                             + ", ".join(KV_FORMATS))

    def row_bytes(self, head_dim: int) -> int:
        """Bytes one token's vector in one head takes when stored."""
        if self.name == "int8":
            return head_dim + _SCALE_BYTES
        return head_dim * (4 if self.name == "float32" else 2)

    def head_dim(self, stored: torch.Tensor) -> int:
        """The width of the float32 rows that ``stored`` holds."""
        return stored.shape[-1] - (_SCALE_BYTES if self.name == "int8" else 0)

    def round(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` (float32) as this format holds it, in float32: what attention reads."""
        if self.name == "float32":
            return x
        if self.name == "int8":
            codes, scale = _quantise(x)
            return codes.to(x.dtype) * scale
        dtype = torch.float16 if self.name == "float16" else torch.bfloat16
        if self.name == "float16":
            x = x.clamp(-_FLOAT16_MAX, _FLOAT16_MAX)
        return x.to(dtype).to(x.dtype)

    def pack(self, x: torch.Tensor) -> torch.Tensor:
        """Rounded ``x`` in its stored form (lossless for values :meth:`round` gave)."""
        if self.name == "float32":
            return x.clone()
        if self.name == "int8":
            codes, scale = _quantise(x)
            return torch.cat([codes, scale.contiguous().view(torch.int8)], dim=-1)
        return x.to(torch.float16 if self.name == "float16" else torch.bfloat16)

    def unpack_into(self, stored: torch.Tensor, out: torch.Tensor) -> None:
        """Write the float32 values of ``stored`` into ``out`` (one pass where it can)."""
        if self.name != "int8":
            out.copy_(stored)
            return
        head_dim = stored.shape[-1] - _SCALE_BYTES
        out.copy_(stored[..., :head_dim])
        out.mul_(stored[..., head_dim:].contiguous().view(torch.float32))


def _quantise(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row int8 codes and float32 scales (a row of zeros gets scale 1)."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    scale = torch.where(amax > 0, amax / 127, torch.ones_like(amax))
    return (x / scale).round().clamp(-127, 127).to(torch.int8), scale


class GrowingLayer(DynamicLayer):
    """A cache layer that writes new states into spare room at its end instead of
    concatenating (DynamicLayer copies every state it holds at each update, which for a
    4,096-token module costs more than the 16 tokens a question computes); the room
    doubles when full. ``keys`` and ``values`` are views of the filled part."""

    def __init__(self, keys: torch.Tensor, values: torch.Tensor, tokens: int) -> None:
        super().__init__()
        self.lazy_initialization(keys, values)
        self._room = (keys, values)
        self._tokens = tokens
        self.keys, self.values = keys[:, :, :tokens], values[:, :, :tokens]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._tokens + key_states.shape[2]
        keys, values = self._room
        if end > keys.shape[2]:
            grown = [torch.empty(*room.shape[:2], max(2 * room.shape[2], end), room.shape[3],
                                 dtype=room.dtype, device=room.device) for room in self._room]
            for old, new in zip(self._room, grown, strict=True):
                new[:, :, :self._tokens] = old[:, :, :self._tokens]
            keys, values = self._room = (grown[0], grown[1])
        keys[:, :, self._tokens:end] = key_states
        values[:, :, self._tokens:end] = value_states
        self._tokens = end
        self.keys, self.values = keys[:, :, :end], values[:, :, :end]
        return self.keys, self.values


class KVCache(DynamicCache):
    """A DynamicCache that rounds every key and value to ``kv_format`` as it arrives, so
    what attention reads is what the store can hold."""

    def __init__(self, kv_format: KVFormat) -> None:
        super().__init__()
        self.kv_format = kv_format
        self.layer_class_to_replicate = _EmptyGrowingLayer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        return super().update(self.kv_format.round(key_states),
                              self.kv_format.round(value_states), layer_idx, *args, **kwargs)

    def fill(self, keys: list[torch.Tensor], values: list[torch.Tensor], tokens: int) -> None:
        """Start each layer on these float32 tensors, whose first ``tokens`` entries are
        filled and the rest is room (taken as they are: no copy)."""
        self.layers = [GrowingLayer(k, v, tokens) for k, v in zip(keys, values, strict=True)]


class _EmptyGrowingLayer(GrowingLayer):
    """A layer that starts empty: its first update sets its room."""

    def __init__(self) -> None:
        DynamicLayer.__init__(self)
        self._room = ()
        self._tokens = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: object,
               **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._room:
            self.lazy_initialization(key_states, value_states)
            self._room = tuple(torch.empty(*s.shape[:2], s.shape[2] + ROOM, s.shape[3],
                                           dtype=s.dtype, device=s.device)
                               for s in (key_states, value_states))
        return super().update(key_states, value_states, *args, **kwargs)


ROOM = 64  # spare entries a cache starts with beyond what it holds: a question's tokens
