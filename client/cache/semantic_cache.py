"""The semantic cache: embed the query, find the most similar cached query, serve its
answer when the cosine similarity reaches tau and the conversational context agrees."""

import contextlib
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
from meancache.client.cache import entry_threshold, feedback
from meancache.client.cache.background import BackgroundWork
from meancache.client.cache.context import context_agrees
from meancache.client.cache.entry import STORED_DTYPE, Context, Entry
from meancache.client.cache.index import VectorIndex
from meancache.client.cache.policy.cache_policy import CachePolicy, PolicySettings
from meancache.client.cache.results import CacheStats, Hit, Miss, ThresholdChange
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.source import Source
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import cache_stats
from meancache.client.cache.threshold import ThresholdState
from meancache.client.cache.verification import Veto, verify
from meancache.client.errors import EntryNotFoundError
from meancache.shared.encoder import Encoder, PCAProjection
from meancache.shared.encoder.pca import neighbour_similarities
from meancache.shared.progress import Progress
from meancache.shared.query import clean_query
from meancache.shared.threshold import best_threshold, nearest_threshold

log = logging.getLogger(__name__)


class SemanticCache:
    """A persistent, context-aware semantic cache of one user's LLM answers.

    Thread-safe within a process (one lock); several processes may share a directory:
    each notices the others' writes through the store's generation counter.

    A change of vector space (a new encoder, a PCA fit, entries stored under another
    encoder) is computed off the lock: lookups keep using the current space until the new
    one is complete. ``background=True`` (the chat) also moves that work off the calling
    thread, with its progress in ``background.status()``.
    """

    def __init__(
        self,
        directory: Path,
        encoder: Encoder,
        settings: CacheSettings | None = None,
        progress: Progress | None = None,
        *,
        background: bool = False,
    ) -> None:
        self.settings = settings or CacheSettings()
        self.store = EntryStore(Path(directory))
        self._pca_dir = Path(directory) / "pca"
        self._lock = threading.RLock()
        self._space_lock = threading.Lock()  # one change of vector space at a time
        self.background = BackgroundWork()
        self._in_background = background
        self._query_vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.policy = CachePolicy(self.store, PolicySettings(
            self.settings.eviction_policy, self.settings.pattern_clustering))
        self.thresholds = ThresholdState(self.store, self.settings.global_threshold)
        self.thresholds.persist_default()
        self.encoder = self._with_stored_pca(encoder)
        self._load()
        if self._stale:
            self._run_job("re-embedding cached questions", self.reembed, progress)

    def close(self) -> None:
        self.background.stop()
        self.policy.close()
        self.store.close()

    def __enter__(self) -> "SemanticCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # encoder state ------------------------------------------------------------------
    def _with_stored_pca(self, encoder: Encoder) -> Encoder:
        """Put back the PCA layer this cache fitted, if it was fitted for this base model."""
        meta = self.store.get_meta("pca")
        if not meta or self.settings.pca_dims == 0:
            return encoder.with_pca(None) if encoder.pca is not None else encoder
        if meta.get("base_version") != encoder.base_version:
            log.info("stored PCA was fitted for another base model; using full embeddings")
            return encoder
        path = self._pca_dir / f"{meta['version']}.safetensors"
        try:
            pca = PCAProjection.load(path)
        except Exception as exc:  # a lost PCA file costs a re-fit, never the entries
            log.warning("could not load PCA layer %s (%s); using full embeddings", path, exc)
            return encoder
        return encoder if encoder.pca is not None and encoder.pca.version == pca.version \
            else encoder.with_pca(pca)

    def set_encoder(self, encoder: Encoder, progress: Progress | None = None) -> int:
        """Switch to another encoder state (e.g. after an FL round), re-embedding every
        entry; returns how many were moved."""
        with self._space_lock:
            return self._switch_space(encoder, partial(_encode_entries, encoder), progress)

    def _run_job(self, label: str, job: Callable[[Progress | None], object],
                 progress: Progress | None) -> None:
        if self._in_background:
            self.background.start(label, job)
        else:
            job(progress)

    # loading and syncing ------------------------------------------------------------
    def _load(self) -> None:
        """(Re)build the in-memory view from the store."""
        with self._lock:
            self._generation = self.store.generation
            index = VectorIndex(self.encoder.dim)
            self._context_vectors: dict[str, np.ndarray] = {}
            self._usage: dict[str, tuple[float, int]] = {}  # id -> (last used, bytes)
            self.policy.forget_all()
            self._stale: set[str] = set()  # stored in another space: not searchable yet
            for entry in self.store.entries():
                self._usage[entry.id] = (entry.last_used, entry.nbytes)
                if entry.encoder_version != self.encoder.version or \
                        entry.embedding.shape != (self.encoder.dim,):
                    self._stale.add(entry.id)
                    continue
                self._index_entry(entry, index)
            self._index = index

    def _index_entry(self, entry: Entry, index: VectorIndex | None = None) -> None:
        target = self._index if index is None else index  # an empty index is falsy
        target.add(entry.id, entry.embedding.astype(np.float32))
        if entry.context_embedding is not None:
            self._context_vectors[entry.id] = entry.context_embedding.astype(np.float32)
        self._usage[entry.id] = (entry.last_used, entry.nbytes)
        self.policy.track(entry)

    def _sync(self) -> None:
        if self.store.generation == self._generation:
            return
        stored = self.store.get_meta("pca")
        current = self.encoder.pca.version if self.encoder.pca is not None else None
        if stored and stored.get("version") != current and self.settings.pca_dims:
            # Another process fitted a PCA layer (and re-embedded): adopt it.
            base = self.encoder.with_pca(None) if self.encoder.pca is not None else self.encoder
            self.encoder = self._with_stored_pca(base)
        self._load()

    def _wrote(self, generation: int) -> bool:
        """After our own write: True if nobody else wrote in between (the view is current)."""
        if generation == self._generation + 1:
            self._generation = generation
            return True
        self._load()
        return False

    # embedding ----------------------------------------------------------------------
    def embed(self, text: str | bytes) -> np.ndarray:
        """``text`` in the cache's current space, remembered for a lookup that follows (the
        pack's similar match and the cache then embed a question once)."""
        with self._lock:
            return self._embed(clean_query(text))

    def _embed(self, text: str) -> np.ndarray:
        """Embed one text, remembering the last few (a follow-up's context was the last query)."""
        key = (self.encoder.version, text)
        vector = self._query_vectors.get(key)
        if vector is None:
            vector = self.encoder.encode([text])[0]
            self._query_vectors[key] = vector
            if len(self._query_vectors) > 64:
                self._query_vectors.popitem(last=False)
        else:
            self._query_vectors.move_to_end(key)
        return vector

    # lookup -------------------------------------------------------------------------
    @property
    def threshold(self) -> float:
        """The tau lookups use now (see ``thresholds`` for both values)."""
        return self.thresholds.current

    def lookup(self, query: str | bytes, context: Context | None = None) -> Hit | Miss:
        query = clean_query(query)
        with self._lock:
            self._sync()
            truncated = self.encoder.is_truncated(query)
            tau = self.threshold
            per_entry = self.settings.entry_thresholds
            candidates, best = self._index.search(
                self._embed(query), self.settings.candidates,
                min_score=entry_threshold.floor(tau) if per_entry else tau)
            context_vector = None
            if self.settings.context_aware and context is not None and context.is_follow_up:
                context_vector = self._embed(clean_query(context.prev_query or ""))
            vetoes: list[Veto] = []
            rejected_before = False
            for entry_id, similarity in candidates:
                if self.settings.context_aware and not context_agrees(
                    self._context_vectors.get(entry_id), context_vector, tau
                ):
                    continue
                try:
                    entry = self.store.get(entry_id)
                    if per_entry and similarity < self._entry_threshold(entry, tau):
                        rejected_before = rejected_before or similarity >= tau
                        continue
                    if self.settings.verify_hits:
                        veto = verify(query, entry.query)
                        if veto is not None:
                            log.info("vetoed a cached answer (similarity %.3f): %s",
                                     similarity, veto.reason)
                            vetoes.append(veto)
                            continue
                    return self._serve(query, entry_id, similarity, truncated)
                except EntryNotFoundError:  # deleted by another process since our last sync
                    continue
            self.store.add_to_counter("misses")
            reason = "no cached query is similar enough"
            if vetoes:
                reason = vetoes[0].reason
            elif rejected_before:
                reason = "a similar question's cached answer was rejected before"
            elif best is not None and best >= tau:
                reason = "similar queries were asked in another context"
            return Miss(query, reason, best, truncated)

    def _entry_threshold(self, entry: Entry, tau: float) -> float:
        """The entry's own threshold, its rejected similarity first re-scored in the current
        vector space if it was measured in another."""
        if entry_threshold.needs_rescoring(entry, self.encoder.version):
            rejected = self._embed(entry_threshold.Evidence.of(entry).rejected_query or "")
            entry = entry_threshold.rescored(entry, rejected, self.encoder.version)
            self.store.touch(entry)
        return entry_threshold.threshold(entry_threshold.Evidence.of(entry), tau)

    def _serve(self, query: str, entry_id: str, similarity: float, truncated: bool) -> Hit:
        entry = self.store.get(entry_id)
        now = time.time()
        entry = replace(entry_threshold.after_accept(entry, query), hits=entry.hits + 1,
                        last_hit=now)
        hit = Hit(query, entry.answer, entry.query, similarity, entry.id, entry.source,
                  uuid.uuid4().hex, truncated)
        self.store.record_hit(entry, hit.hit_id, feedback.accepted(hit, now))
        self.store.add_to_counter("hits")
        self.store.add_to_counter("tokens_saved", entry.query_tokens + entry.answer_tokens)
        self._usage[entry.id] = (now, entry.nbytes)
        self.policy.hit(entry.id)
        return hit

    # insert / delete ----------------------------------------------------------------
    def insert(
        self,
        query: str | bytes,
        answer: str,
        context: Context | None = None,
        source: Source = Source.UPSTREAM,
        query_tokens: int | None = None,
        answer_tokens: int | None = None,
        progress: Progress | None = None,
    ) -> Entry:
        """Store an answer. Token counts default to the encoder tokenizer's count. A full cache
        under a SCALM policy stores only queries of mid- and high-rank patterns; the entry is
        returned either way (``len`` and ``entries`` tell whether it was kept)."""
        query = clean_query(query)
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError("answer is empty")
        context = context or Context()
        with self._lock:
            self._sync()
            context_query = clean_query(context.prev_query) if context.prev_query else None
            entry = Entry(
                query=query, answer=answer,
                embedding=self._embed(query).astype(STORED_DTYPE),
                encoder_version=self.encoder.version,
                context_query=context_query,
                context_embedding=None if context_query is None
                else self._embed(context_query).astype(STORED_DTYPE),
                conversation_id=context.conversation_id, turn=context.turn,
                prev_id=context.prev_entry_id, source=source,
                query_tokens=self.encoder.count_tokens(query) if query_tokens is None
                else query_tokens,
                answer_tokens=self.encoder.count_tokens(answer) if answer_tokens is None
                else answer_tokens,
            )
            self.store.add_to_counter("tokens_upstream", entry.query_tokens + entry.answer_tokens)
            self.policy.asked(entry, self.threshold)
            full = len(self._usage) >= self.settings.max_entries or entry.nbytes + sum(
                size for _, size in self._usage.values()) > self.settings.max_bytes
            if not self.policy.admits(entry, full):
                log.debug("not admitted: a full cache keeps only mid- and high-rank patterns")
                return entry
            if self._wrote(self.store.put(entry)):
                self._index_entry(entry)
            self._evict()
        self._maybe_fit_pca(progress)
        return entry

    def delete(self, entry_id: str) -> bool:
        with self._lock:
            self._sync()
            existed = entry_id in self._usage
            if self._wrote(self.store.delete([entry_id])):
                self._forget(entry_id)
            return existed

    def clear(self) -> int:
        with self._lock:
            removed = self.store.clear_entries()
            self._load()
            return removed

    def _forget(self, entry_id: str) -> None:
        self._index.remove(entry_id)
        self._context_vectors.pop(entry_id, None)
        self._usage.pop(entry_id, None)
        self.policy.forget(entry_id)

    def _evict(self) -> None:
        """Evict in the order of the ``eviction_policy`` until both limits hold."""
        over_count = len(self._usage) - self.settings.max_entries
        over_bytes = sum(size for _, size in self._usage.values()) - self.settings.max_bytes
        if over_count <= 0 and over_bytes <= 0:
            return
        victims = self.policy.victims(self._usage, over_count, over_bytes)
        if self._wrote(self.store.delete(victims)):
            for entry_id in victims:
                self._forget(entry_id)
        self.store.add_to_counter("evictions", len(victims))
        log.info("evicted %d entries to stay within capacity", len(victims))

    # re-embedding and PCA -----------------------------------------------------------
    def reembed(self, progress: Progress | None = None) -> int:
        """Re-embed the entries stored under another encoder version; each becomes
        searchable as soon as its batch is written."""
        with self._space_lock:
            with self._lock:
                self._sync()
                stale, encoder = sorted(self._stale), self.encoder
            return self._move_entries(stale, encoder, partial(_encode_entries, encoder),
                                      progress)

    def _switch_space(self, encoder: Encoder, vectors_of: "VectorsOf",
                      progress: Progress | None,
                      on_switch: Callable[[], None] | None = None) -> int:
        """Move every entry into ``encoder``'s space, then make it the current one (after
        ``on_switch``, under the lock, for state that must change at the same moment)."""
        with self._lock:
            self._sync()
            ids = sorted(self._usage)
        moved = self._move_entries(ids, encoder, vectors_of, progress)
        with self._lock:
            self.encoder = encoder
            if on_switch is not None:
                on_switch()
            self._load()
            arrived = sorted(self._stale)
        if arrived:  # inserted in the old space while we worked: a handful at most
            self._move_entries(arrived, encoder, partial(_encode_entries, encoder), None)
        return moved

    def _move_entries(self, ids: list[str], encoder: Encoder, vectors_of: "VectorsOf",
                      progress: Progress | None, batch_size: int = 64) -> int:
        """Write the entries ``ids`` with vectors in ``encoder``'s space, a batch at a time.

        The vectors are computed off the lock, so lookups go on meanwhile. Each batch is
        written from the entry as stored at that moment: hits recorded meanwhile are kept,
        entries deleted meanwhile stay deleted.
        """
        for start in range(0, len(ids), batch_size):
            batch = self._read(ids[start:start + batch_size])
            vectors, contexts = vectors_of(batch) if batch else (np.empty((0, 0)), [])
            moved = {e.id: (v, c) for e, v, c in zip(batch, vectors, contexts, strict=True)}
            with self._lock:
                updated = [e.with_vectors(*moved[e.id], encoder.version)
                           for e in self._read(list(moved))]
                if updated and self._wrote(self.store.put_many(updated)) \
                        and encoder is self.encoder:
                    for entry in updated:
                        self._index_entry(entry)
                        self._stale.discard(entry.id)
            if progress is not None:
                progress(min(start + batch_size, len(ids)), len(ids))
        return len(ids)

    def _read(self, ids: list[str]) -> list[Entry]:
        """The stored entries among ``ids`` (others were deleted)."""
        entries = []
        for entry_id in ids:
            with contextlib.suppress(EntryNotFoundError):
                entries.append(self.store.get(entry_id))
        return entries

    def _maybe_fit_pca(self, progress: Progress | None) -> None:
        dims = self.settings.pca_dims
        if dims == 0 or self.encoder.pca is not None or self._space_lock.locked():
            return
        if len(self._index) < max(self.settings.pca_min_entries, dims):
            return
        self._run_job("fitting PCA on cached questions", self.fit_pca, progress)

    def fit_pca(self, progress: Progress | None = None) -> PCAProjection:
        """Fit the PCA layer on this user's cached query embeddings and move every entry
        into its space. Vectors stored in the full space are projected, not re-embedded,
        so this takes seconds even for a large cache."""
        with self._space_lock:
            with self._lock:
                self._sync()
                base = self.encoder.with_pca(None) if self.encoder.pca is not None \
                    else self.encoder
                ids, current = self._index.ids, self._index.vectors()
                in_full_space = base is self.encoder
            full = current if in_full_space else base.encode([e.query for e in self._read(ids)])
            pca = PCAProjection.fit(full, self.settings.pca_dims)
            pca.save(self._pca_dir / f"{pca.version}.safetensors")
            target = base.with_pca(pca)
            carried = neighbour_similarities(current, target.project(full))

            def switched() -> None:
                self.thresholds.carry(*carried)
                self.store.set_meta("pca", {"version": pca.version,
                                            "base_version": base.base_version})

            self._switch_space(target, partial(_project_entries, base, target), progress,
                               switched)
            log.info("fitted PCA-%d on %d cached queries", pca.out_dim, len(full))
            return pca

    # feedback -----------------------------------------------------------------------
    def reject(self, hit: Hit) -> ThresholdChange:
        """The user says ``hit`` was wrong: record a negative pair and re-tune tau.

        The caller then fetches a fresh answer, bypassing the cache.
        """
        with self._lock:
            self.store.put_pair(hit.hit_id, feedback.rejected(hit))
            try:
                entry = self.store.get(hit.entry_id)
                self.store.touch(entry_threshold.after_reject(
                    replace(entry, rejections=entry.rejections + 1), hit.query,
                    hit.similarity, self.encoder.version))
            except EntryNotFoundError:
                pass
            self.store.add_to_counter("rejections")
            return self.retune()

    def retune(self, max_pairs: int = 2000) -> ThresholdChange:
        """Maximise F0.5 over the labelled pairs, re-scored with the current encoder."""
        with self._lock:
            pairs = feedback.labelled_pairs(self.store, newest=max_pairs)
            labels = np.array([p.label for p in pairs], dtype=int)
            positives, negatives = int(labels.sum()), int(len(labels) - labels.sum())
            old = self.threshold
            need = self.settings.tune_min_per_class
            if positives < need or negatives < need:
                return ThresholdChange(
                    old, old, positives, negatives,
                    f"needs {need} accepted and {need} rejected hits to re-tune; "
                    f"has {positives} and {negatives}",
                )
            a = self.encoder.encode([p.q1 for p in pairs])
            b = self.encoder.encode([p.q2 for p in pairs])
            best = best_threshold((a * b).sum(1), labels)
            new = round(nearest_threshold(best.threshold), 4)
            self.thresholds.set_local(new)
            return ThresholdChange(old, new, positives, negatives,
                                   f"F0.5 {best.f05:.3f} on {len(pairs)} labelled pairs")

    # inspection ---------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        return sorted(self.store.entries(), key=lambda e: e.created)

    def __len__(self) -> int:
        with self._lock:
            self._sync()
            return len(self._usage)

    def stats(self) -> CacheStats:
        with self._lock:
            self._sync()
            return cache_stats(
                self.store, self.thresholds, entries=len(self._usage),
                nbytes=sum(size for _, size in self._usage.values()),
                stale_entries=len(self._stale), encoder_version=self.encoder.version,
                encoder_backend=self.encoder.backend, embedding_dim=self.encoder.dim)


# Vectors for a batch of entries in some space: (queries (n, dim), each context or None).
VectorsOf = Callable[[list[Entry]], tuple[np.ndarray, list[np.ndarray | None]]]


def _encode_entries(encoder: Encoder, entries: list[Entry]
                    ) -> tuple[np.ndarray, list[np.ndarray | None]]:
    vectors = encoder.encode([e.query for e in entries])
    asked = [e.context_query for e in entries if e.context_query]
    found = iter(encoder.encode(asked)) if asked else iter(())
    return vectors, [next(found) if e.context_query else None for e in entries]


def _project_entries(base: Encoder, target: Encoder, entries: list[Entry]
                     ) -> tuple[np.ndarray, list[np.ndarray | None]]:
    """Entries stored in ``base``'s full space, projected into ``target``'s PCA space."""
    if any(e.encoder_version != base.version for e in entries):
        return _encode_entries(target, entries)
    vectors = target.project(np.stack([e.embedding.astype(np.float32) for e in entries]))
    contexts = [None if e.context_embedding is None
                else target.project(e.context_embedding.astype(np.float32)[None])[0]
                for e in entries]
    return vectors, contexts
