"""Attention states kept within a byte budget; the least recently used go first.

Two kinds share the budget and the one LRU order: PML module states (keyed by schema and
segment) and the token blocks of automatic prefix reuse (keyed by their tenant's prefix
namespace and the block's chain hash, see prompt_cache.prefixes). An evicted module is not
lost: its layout stays, and the next prompt that imports it encodes it again; an evicted
prefix block is computed again by the next prompt that starts with it.
"""

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable

from meancache.upstream.prompt_cache.states import SegmentStates

Key = tuple[str, str]  # (schema, segment), or (a tenant's prefix namespace, block hash)


class ModuleStore:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._states: OrderedDict[Key, SegmentStates] = OrderedDict()
        self._lock = threading.Lock()
        self._nbytes = self._tokens = 0  # of the states held, kept as they come and go
        self.evictions = 0
        self.encodings = 0

    @property
    def nbytes(self) -> int:
        """Bytes held; safe to read from any thread (the metrics endpoint does)."""
        with self._lock:
            return self._nbytes

    @property
    def tokens(self) -> int:
        with self._lock:
            return self._tokens

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._states

    def get(self, key: Key, encode: Callable[[], SegmentStates],
            pinned: frozenset[Key] = frozenset()) -> SegmentStates:
        """The states for ``key``, encoding them if absent; ``pinned`` keys are never evicted
        to make room (they are in use by the same request)."""
        states = self.find(key)
        if states is not None:
            self.touch([key])
            return states
        states = encode()
        with self._lock:
            self.encodings += 1
        self.put(key, states, pinned)
        return states

    def find(self, key: Key) -> SegmentStates | None:
        """The states for ``key`` if held, without counting it as a use."""
        with self._lock:
            return self._states.get(key)

    def touch(self, keys: Iterable[Key]) -> None:
        """Count ``keys`` as used now, in order: the last is the most recently used."""
        with self._lock:
            for key in keys:
                if key in self._states:
                    self._states.move_to_end(key)

    def put(self, key: Key, states: SegmentStates, pinned: frozenset[Key] = frozenset()) -> None:
        """Hold ``states`` as the most recently used, evicting others (never ``pinned``)."""
        with self._lock:
            self._pop(key)
            self._states[key] = states
            self._nbytes += states.nbytes
            self._tokens += states.tokens
            self._shrink(pinned | {key})

    def drop_schema(self, schema: str) -> None:
        with self._lock:
            for key in [k for k in self._states if k[0] == schema]:
                self._pop(key)

    def _pop(self, key: Key) -> None:
        states = self._states.pop(key, None)
        if states is not None:
            self._nbytes -= states.nbytes
            self._tokens -= states.tokens

    def _shrink(self, pinned: frozenset[Key]) -> None:
        """Evict the least recently used, never a pinned key, until within budget (an
        insert that stays within it costs O(1))."""
        if self._nbytes <= self.budget_bytes:
            return
        for key in list(self._states):
            if self._nbytes <= self.budget_bytes:
                break
            if key in pinned:
                continue
            self._pop(key)
            self.evictions += 1
