"""Attention (key/value) states of one segment, computed at its own position IDs.

transformers 5.x notes, each covered by a test:
- there is no ``cache_position``: positions are passed as ``position_ids`` every time;
- a jump in ``position_ids`` without a cache or a 4D mask is taken for packed sequences,
  so every forward pass here gets an explicit 4D additive mask;
- a ``DynamicCache`` grows in place during a forward pass, so a request never runs on a
  module's own tensors: serving unpacks them into a fresh cache (prompt_cache.kv_format:
  states are stored in the engine's KV format and read as float32);
- models with sliding-window layers (Gemma 3) take a dict of masks keyed by layer type; a
  single 4D mask would be applied to the sliding layers too, letting them see too far back.
  Our caches have no sliding cache layers (no ``config``): the window is applied by
  position in the mask, and a request's sliding layers are handed only the states within
  reach of its queries (:func:`out_of_window`), so their cost does not grow with a
  module's length.
"""

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from meancache.upstream.kv_rounding import KVFormat
from meancache.upstream.prompt_cache.kv_format import ROOM, KVCache
from transformers import PreTrainedConfig, PreTrainedModel


def additive_mask(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(q, kv) booleans -> (1, 1, q, kv) mask of 0 where allowed, the dtype's minimum elsewhere.

    Additive masks work with eager and SDPA attention alike.
    """
    mask = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    mask.masked_fill_(~allowed, torch.finfo(dtype).min)
    return mask[None, None]


def sliding_window(config: PreTrainedConfig) -> int | None:
    """The window of the model's sliding-attention layers, if it has any by layer type."""
    if "sliding_attention" in (getattr(config, "layer_types", None) or ()):
        return int(config.sliding_window)
    return None


def sliding_layers(config: PreTrainedConfig) -> tuple[bool, ...]:
    """Per layer, whether it attends only within the sliding window (none if no window)."""
    if sliding_window(config) is None:
        return ()
    return tuple(kind == "sliding_attention" for kind in config.layer_types)


def out_of_window(positions: torch.Tensor, first_query: int, window: int | None) -> int:
    """How many of the first cached ``positions`` (in cache order) no sliding layer can
    attend to from a query at ``first_query`` or later: each lies ``window`` or more
    positions behind every such query, so leaving it out changes nothing those layers
    compute (its masked weight is exactly 0). Counted from the start only, so that what
    the sliding layers hold is a suffix of what the full layers hold."""
    if window is None or not positions.numel():
        return 0
    reachable = positions > first_query - window
    return int(reachable.int().argmax()) if reachable.any() else int(positions.numel())


def attention_mask(model: PreTrainedModel, allowed: torch.Tensor, query_positions: torch.Tensor,
                   key_positions: torch.Tensor, sliding_skip: int = 0
                   ) -> torch.Tensor | dict[str, torch.Tensor]:
    """The mask for a forward pass: ``allowed`` (q, kv) says which keys each query may see.

    Cached segments sit at their own positions, not at their index in the cache, so the
    sliding window is measured in positions: a key ``window`` or more positions behind the
    query is hidden from the sliding layers (transformers' ``kv > q - window``). Their
    cache lacks the first ``sliding_skip`` keys (KVCache.sliding_skip), so their mask does.
    """
    full = additive_mask(allowed, model.dtype)
    window = sliding_window(model.config)
    if window is None:
        return full
    keys = key_positions[sliding_skip:]
    near = query_positions[:, None] - keys[None, :] < window
    return {"full_attention": full,
            "sliding_attention": additive_mask(allowed[:, sliding_skip:] & near, model.dtype)}


@dataclass(frozen=True)
class SegmentStates:
    keys: tuple[torch.Tensor, ...]  # per layer: (1, kv_heads, tokens, row), stored (KVFormat.pack)
    values: tuple[torch.Tensor, ...]
    positions: torch.Tensor  # (tokens,)

    @property
    def tokens(self) -> int:
        return int(self.positions.numel())

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))


@torch.inference_mode()
def encode_segment(model: PreTrainedModel, kv_format: KVFormat, token_ids: list[int],
                   positions: list[int], leading: SegmentStates | None = None) -> SegmentStates:
    """One forward pass over the segment (causal within it) at its positions, attending
    also to the ``leading`` states; only the segment's own states are returned, stored."""
    device = next(model.parameters()).device
    ids = torch.tensor([token_ids], device=device)
    pos = torch.tensor([positions], device=device)
    n = len(token_ids)
    cache, _ = concatenate([leading] if leading is not None else [], kv_format)
    before = leading.tokens if leading is not None else 0
    allowed = torch.cat([torch.ones(n, before, dtype=torch.bool, device=device),
                         torch.ones(n, n, dtype=torch.bool, device=device).tril()], dim=1)
    keys = torch.cat([leading.positions.to(device), pos[0]]) if leading is not None else pos[0]
    model(input_ids=ids, position_ids=pos,
          attention_mask=attention_mask(model, allowed, pos[0], keys),
          past_key_values=cache, use_cache=True, logits_to_keep=1)
    return stored_slice(cache, kv_format, before, None, pos[0].clone())


def stored_slice(cache: KVCache, kv_format: KVFormat, start: int, stop: int | None,
                 positions: torch.Tensor) -> SegmentStates:
    """The states of cache entries ``start:stop`` (counted in every layer's full sequence:
    a layer lacking its first entries has them subtracted), packed for the store."""
    def part(layer_index: int, tensor: torch.Tensor) -> torch.Tensor:
        skip = cache.held_from(layer_index)
        if start < skip:
            raise ValueError(f"layer {layer_index} does not hold entry {start}")
        return kv_format.pack(tensor[:, :, start - skip:None if stop is None else stop - skip])

    return SegmentStates(
        tuple(part(i, layer.keys) for i, layer in enumerate(cache.layers)),
        tuple(part(i, layer.values) for i, layer in enumerate(cache.layers)),
        positions,
    )


def concatenate(states: list[SegmentStates], kv_format: KVFormat,
                sliding: Sequence[bool] = (), sliding_skip: int = 0
                ) -> tuple[KVCache, torch.Tensor]:
    """A fresh cache holding the segments side by side (unpacked straight into one float32
    tensor per layer: one pass over the stored bytes), and their positions. The layers
    marked in ``sliding`` leave out the first ``sliding_skip`` states (out_of_window): they
    are neither unpacked nor attended to."""
    cache = KVCache(kv_format)
    if not states:
        return cache, torch.empty(0, dtype=torch.long)
    tokens = sum(s.tokens for s in states)

    def joined(parts: list[torch.Tensor], skip: int) -> torch.Tensor:
        out = torch.empty(*parts[0].shape[:2], tokens - skip + ROOM,
                          kv_format.head_dim(parts[0]), device=parts[0].device)
        at = -skip  # where the next part starts in ``out``
        for part in parts:
            end = at + part.shape[2]
            if end > 0:
                kv_format.unpack_into(part[:, :, max(0, -at):], out[:, :, max(0, at):end])
            at = end
        return out

    skips = [sliding_skip if i < len(sliding) and sliding[i] else 0
             for i in range(len(states[0].keys))]
    cache.fill([joined([s.keys[i] for s in states], skip) for i, skip in enumerate(skips)],
               [joined([s.values[i] for s in states], skip) for i, skip in enumerate(skips)],
               tokens, skips)
    return cache, torch.cat([s.positions for s in states])


def bytes_per_token(model: PreTrainedModel, kv_format: KVFormat) -> int:
    """2 (K and V) x layers x kv_heads x the bytes of one head's row in ``kv_format``."""
    config = model.config
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    return 2 * layers * kv_heads * kv_format.row_bytes(head_dim)
