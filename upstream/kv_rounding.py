"""How attention (key/value) states are held: the format of the KV cache (its rounding
and stored form; prompt_cache.kv_format holds the cache that rounds with it, and the int4
decode graph traces the same rounding, so it lives below both).

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
