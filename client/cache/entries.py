"""The cache's entries: the store on disk and this process's view of it (the vector
index, each entry's context vector and size, which entries wait for re-embedding), kept
current by every write, the only code that reads or writes that view.

Several processes may share a directory: each notices the others' writes through the
store's generation counter (``changed``) and reloads; its own writes bump the generation
by one (``wrote``), so the view stays as it is unless another process wrote in between.
Every method runs under ``lock``, the cache's one lock, which its callers take.
"""

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator

import numpy as np
from meancache.client.cache.context import context_agrees
from meancache.client.cache.entry import Entry
from meancache.client.cache.index import VectorIndex
from meancache.client.cache.policy.cache_policy import CachePolicy
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.store import EntryStore
from meancache.client.errors import EntryNotFoundError
from meancache.shared.encoder import Encoder

log = logging.getLogger(__name__)


class CachedEntries:
    def __init__(self, store: EntryStore, settings: CacheSettings, policy: CachePolicy,
                 space: Callable[[], Encoder]) -> None:
        """``space``: the current vector space; entries stored in another wait in
        ``stale`` until they are re-embedded."""
        self.store = store
        self.settings = settings
        self.policy = policy  # follows every entry kept, hit and forgotten
        self._space = space
        self.lock = threading.RLock()
        self.load()

    def load(self) -> None:
        """(Re)build the view from the store."""
        with self.lock:
            encoder = self._space()
            self._generation = self.store.generation
            index = VectorIndex(encoder.dim)
            self._context_vectors: dict[str, np.ndarray] = {}
            self._bound: set[str] = set()  # entries that answer only in their own context
            self._usage: dict[str, tuple[float, int]] = {}  # id -> (last used, bytes)
            self.policy.forget_all()
            self.stale: set[str] = set()  # stored in another space: not searchable yet
            for entry in self.store.entries():
                self._usage[entry.id] = (entry.last_used, entry.nbytes)
                if entry.encoder_version != encoder.version or \
                        entry.embedding.shape != (encoder.dim,):
                    self.stale.add(entry.id)
                    continue
                self._index_entry(entry, index)
            self.index = index

    def changed(self) -> bool:
        """Another process wrote since the view was (re)built."""
        return self.store.generation != self._generation

    def wrote(self, generation: int) -> bool:
        """After our own write: True if nobody else wrote in between (the view is current)."""
        if generation == self._generation + 1:
            self._generation = generation
            return True
        self.load()
        return False

    def _index_entry(self, entry: Entry, index: VectorIndex | None = None) -> None:
        target = self.index if index is None else index  # an empty index is falsy
        target.add(entry.id, entry.embedding.astype(np.float32))
        if entry.context_embedding is not None:
            self._context_vectors[entry.id] = entry.context_embedding.astype(np.float32)
        if entry.context_bound:
            self._bound.add(entry.id)
        self._usage[entry.id] = (entry.last_used, entry.nbytes)
        self.policy.track(entry)

    def _forget(self, entry_id: str) -> None:
        self.index.remove(entry_id)
        self._context_vectors.pop(entry_id, None)
        self._bound.discard(entry_id)
        self._usage.pop(entry_id, None)
        self.policy.forget(entry_id)

    # reading --------------------------------------------------------------------------
    @property
    def ids(self) -> list[str]:
        """Every entry of the view, searchable or stale."""
        return sorted(self._usage)

    def __len__(self) -> int:
        return len(self._usage)

    @property
    def nbytes(self) -> int:
        return sum(size for _, size in self._usage.values())

    def read(self, ids: list[str]) -> list[Entry]:
        """The stored entries among ``ids`` (others were deleted)."""
        entries = []
        for entry_id in ids:
            with contextlib.suppress(EntryNotFoundError):
                entries.append(self.store.get(entry_id))
        return entries

    def in_context(self, found: list[tuple[str, float]], context_vector: np.ndarray | None,
                   tau: float) -> Iterator[tuple[Entry, float]]:
        """The entries found, best first, less those asked in another context
        (client/cache/context.py); each read only when the caller gets to it."""
        for entry_id, similarity in found:
            if self.settings.context_aware and not context_agrees(
                    self._context_vectors.get(entry_id), context_vector, tau,
                    self.index.vector(entry_id), entry_id in self._bound):
                continue
            try:
                yield self.store.get(entry_id), similarity
            except EntryNotFoundError:  # deleted by another process since our last sync
                continue

    # writing --------------------------------------------------------------------------
    def served(self, entry: Entry, hit_id: str, pair: dict[str, object]) -> None:
        """The entry as served, with the hit's labelled pair, in one transaction."""
        self.store.record_hit(entry, hit_id, pair)
        self.store.add_to_counter("hits")
        self.store.add_to_counter("tokens_saved", entry.query_tokens + entry.answer_tokens)
        self._usage[entry.id] = (entry.last_used, entry.nbytes)  # last_used: this hit
        self.policy.hit(entry.id)

    def bound(self, entry: Entry) -> None:
        """``entry`` (bound to its context) written, and answering only in it from now."""
        if self.wrote(self.store.put(entry)):
            self._bound.add(entry.id)

    def is_full_with(self, entry: Entry) -> bool:
        """Storing ``entry`` would pass a capacity limit."""
        return len(self._usage) >= self.settings.max_entries or \
            entry.nbytes + self.nbytes > self.settings.max_bytes

    def put(self, entry: Entry) -> None:
        """Store ``entry`` and make room for it."""
        if self.wrote(self.store.put(entry)):
            self._index_entry(entry)
        self._evict()

    def moved(self, entries: list[Entry], searchable: bool) -> None:
        """``entries`` rewritten with their vectors in another space; ``searchable``: that
        space is the current one, so they join the index at once."""
        if entries and self.wrote(self.store.put_many(entries)) and searchable:
            for entry in entries:
                self._index_entry(entry)
                self.stale.discard(entry.id)

    def delete(self, entry_id: str) -> bool:
        existed = entry_id in self._usage
        if self.wrote(self.store.delete([entry_id])):
            self._forget(entry_id)
        return existed

    def clear(self) -> int:
        removed = self.store.clear_entries()
        self.load()
        return removed

    def _evict(self) -> None:
        """Evict in the order of the ``eviction_policy`` until both limits hold."""
        over_count = len(self._usage) - self.settings.max_entries
        over_bytes = self.nbytes - self.settings.max_bytes
        if over_count <= 0 and over_bytes <= 0:
            return
        victims = self.policy.victims(self._usage, over_count, over_bytes)
        if self.wrote(self.store.delete(victims)):
            for entry_id in victims:
                self._forget(entry_id)
        self.store.add_to_counter("evictions", len(victims))
        log.info("evicted %d entries to stay within capacity", len(victims))
