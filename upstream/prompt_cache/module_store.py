"""Module states kept within a byte budget; the least recently used go first.

An evicted module is not lost: its layout stays, and the next prompt that imports it
encodes it again.
"""

import threading
from collections import OrderedDict
from collections.abc import Callable

from meancache.upstream.prompt_cache.states import SegmentStates

Key = tuple[str, str]  # (schema, segment)


class ModuleStore:
    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._states: OrderedDict[Key, SegmentStates] = OrderedDict()
        self._lock = threading.Lock()
        self.evictions = 0
        self.encodings = 0

    @property
    def nbytes(self) -> int:
        """Bytes held; safe to read from any thread (the metrics endpoint does)."""
        with self._lock:
            return self._nbytes()

    @property
    def tokens(self) -> int:
        with self._lock:
            return sum(s.tokens for s in self._states.values())

    def _nbytes(self) -> int:
        return sum(s.nbytes for s in self._states.values())

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return key in self._states

    def get(self, key: Key, encode: Callable[[], SegmentStates],
            pinned: frozenset[Key] = frozenset()) -> SegmentStates:
        """The states for ``key``, encoding them if absent; ``pinned`` keys are never evicted
        to make room (they are in use by the same request)."""
        with self._lock:
            states = self._states.get(key)
            if states is not None:
                self._states.move_to_end(key)
                return states
        states = encode()
        with self._lock:
            self.encodings += 1
            self._states[key] = states
            self._shrink(pinned | {key})
        return states

    def drop_schema(self, schema: str) -> None:
        with self._lock:
            for key in [k for k in self._states if k[0] == schema]:
                del self._states[key]

    def _shrink(self, pinned: frozenset[Key]) -> None:
        total = self._nbytes()
        for key in list(self._states):
            if total <= self.budget_bytes:
                break
            if key in pinned:
                continue
            total -= self._states.pop(key).nbytes
            self.evictions += 1
