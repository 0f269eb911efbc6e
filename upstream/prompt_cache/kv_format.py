"""The KV cache that rounds attention states to a KV format (upstream.kv_rounding) as
the model computes them, so what attention reads is what the store can hold; its layers
grow in place.
"""

import torch
from meancache.upstream.kv_rounding import KVFormat
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


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
        self._skips: list[int] = []  # per layer: the first entries it was never given
        #: How many of the first entries the sliding-window layers lack (the same for each):
        #: their masks leave out as many keys (prompt_cache.states.attention_mask).
        self.sliding_skip = 0

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int,
               *args: object, **kwargs: object) -> tuple[torch.Tensor, torch.Tensor]:
        return super().update(self.kv_format.round(key_states),
                              self.kv_format.round(value_states), layer_idx, *args, **kwargs)

    def fill(self, keys: list[torch.Tensor], values: list[torch.Tensor], tokens: int,
             skips: list[int]) -> None:
        """Start each layer on these float32 tensors, which hold entries ``skips[layer]`` to
        ``tokens`` of the sequence, the rest being room (taken as they are: no copy)."""
        self.layers = [GrowingLayer(k, v, tokens - skip)
                       for k, v, skip in zip(keys, values, skips, strict=True)]
        self._skips = list(skips)
        self.sliding_skip = max(skips, default=0)

    def held_from(self, layer: int) -> int:
        """The index in the sequence of ``layer``'s first entry."""
        return self._skips[layer] if layer < len(self._skips) else 0


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
