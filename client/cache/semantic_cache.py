"""The semantic cache: embed the query, find the most similar cached query, serve its
answer when the cosine similarity reaches tau and the conversational context agrees."""

import logging
import threading
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from meancache.client.cache import feedback
from meancache.client.cache.context import context_agrees
from meancache.client.cache.entry import STORED_DTYPE, Context, Entry
from meancache.client.cache.index import VectorIndex
from meancache.client.cache.results import CacheStats, Hit, Miss, ThresholdChange
from meancache.client.cache.source import Source
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import cache_stats
from meancache.client.cache.threshold import ThresholdState
from meancache.client.cache.verification import Veto, verify
from meancache.client.errors import EntryNotFoundError
from meancache.shared.encoder import DEFAULT_PCA_DIMS, Encoder, PCAProjection
from meancache.shared.encoder.pca import neighbour_similarities
from meancache.shared.progress import Progress
from meancache.shared.query import clean_query
from meancache.shared.threshold import DEFAULT_THRESHOLD, best_threshold, nearest_threshold

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CacheSettings:
    global_threshold: float = DEFAULT_THRESHOLD
    max_entries: int = 100_000
    max_bytes: int = 512 * 1024 * 1024
    context_aware: bool = True
    pca_dims: int = DEFAULT_PCA_DIMS  # 0 keeps full embeddings
    pca_min_entries: int = 1000
    tune_min_per_class: int = 5
    candidates: int = 8  # nearest entries checked for context agreement
    verify_hits: bool = True  # veto look-alike candidates that need another answer


class SemanticCache:
    """A persistent, context-aware semantic cache of one user's LLM answers.

    Thread-safe within a process (one lock); several processes may share a directory:
    each notices the others' writes through the store's generation counter.
    """

    def __init__(
        self,
        directory: Path,
        encoder: Encoder,
        settings: CacheSettings | None = None,
        progress: Progress | None = None,
    ) -> None:
        self.settings = settings or CacheSettings()
        self.store = EntryStore(Path(directory))
        self._pca_dir = Path(directory) / "pca"
        self._lock = threading.RLock()
        self._query_vectors: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.thresholds = ThresholdState(self.store, self.settings.global_threshold)
        self.thresholds.persist_default()
        self.encoder = self._with_stored_pca(encoder)
        self._load()
        if self._stale:
            self.reembed(progress)

    def close(self) -> None:
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
        """Switch to another encoder state (e.g. after an FL round); re-embeds what is stored."""
        with self._lock:
            self.encoder = encoder
            self._load()
            return self.reembed(progress)

    # loading and syncing ------------------------------------------------------------
    def _load(self) -> None:
        """(Re)build the in-memory view from the store."""
        with self._lock:
            self._generation = self.store.generation
            index = VectorIndex(self.encoder.dim)
            self._context_vectors: dict[str, np.ndarray] = {}
            self._usage: dict[str, tuple[float, int]] = {}  # id -> (last used, bytes)
            self._stale: list[str] = []
            for entry in self.store.entries():
                self._usage[entry.id] = (entry.last_used, entry.nbytes)
                if entry.encoder_version != self.encoder.version or \
                        entry.embedding.shape != (self.encoder.dim,):
                    self._stale.append(entry.id)
                    continue
                self._index_entry(entry, index)
            self._index = index

    def _index_entry(self, entry: Entry, index: VectorIndex | None = None) -> None:
        target = self._index if index is None else index  # an empty index is falsy
        target.add(entry.id, entry.embedding.astype(np.float32))
        if entry.context_embedding is not None:
            self._context_vectors[entry.id] = entry.context_embedding.astype(np.float32)
        self._usage[entry.id] = (entry.last_used, entry.nbytes)

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
            candidates, best = self._index.search(self._embed(query), self.settings.candidates,
                                                  min_score=tau)
            context_vector = None
            if self.settings.context_aware and context is not None and context.is_follow_up:
                context_vector = self._embed(clean_query(context.prev_query or ""))
            vetoes: list[Veto] = []
            for entry_id, similarity in candidates:
                if self.settings.context_aware and not context_agrees(
                    self._context_vectors.get(entry_id), context_vector, tau
                ):
                    continue
                try:
                    if self.settings.verify_hits:
                        veto = verify(query, self.store.get(entry_id).query)
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
            elif best is not None and best >= tau:
                reason = "similar queries were asked in another context"
            return Miss(query, reason, best, truncated)

    def _serve(self, query: str, entry_id: str, similarity: float, truncated: bool) -> Hit:
        entry = self.store.get(entry_id)
        now = time.time()
        entry = replace(entry, hits=entry.hits + 1, last_hit=now)
        hit = Hit(query, entry.answer, entry.query, similarity, entry.id, entry.source,
                  uuid.uuid4().hex, truncated)
        self.store.record_hit(entry, hit.hit_id, feedback.accepted(hit, now))
        self.store.add_to_counter("hits")
        self.store.add_to_counter("tokens_saved", entry.query_tokens + entry.answer_tokens)
        self._usage[entry.id] = (now, entry.nbytes)
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
        """Store an answer. Token counts default to the encoder tokenizer's count."""
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

    def _evict(self) -> None:
        """Least recently used first, until both limits hold (SCALM's policy comes later)."""
        over_count = len(self._usage) - self.settings.max_entries
        total = sum(size for _, size in self._usage.values())
        if over_count <= 0 and total <= self.settings.max_bytes:
            return
        victims: list[str] = []
        for entry_id, (_, size) in sorted(self._usage.items(), key=lambda kv: kv[1][0]):
            if over_count <= 0 and total <= self.settings.max_bytes:
                break
            victims.append(entry_id)
            over_count -= 1
            total -= size
        if self._wrote(self.store.delete(victims)):
            for entry_id in victims:
                self._forget(entry_id)
        self.store.add_to_counter("evictions", len(victims))
        log.info("evicted %d entries to stay within capacity", len(victims))

    # re-embedding and PCA -----------------------------------------------------------
    def reembed(self, progress: Progress | None = None, batch_size: int = 64) -> int:
        """Re-embed entries stored under another encoder version, in batches."""
        with self._lock:
            stale = list(self._stale)
            done = 0
            for start in range(0, len(stale), batch_size):
                batch: list[Entry] = []
                for entry_id in stale[start:start + batch_size]:
                    try:
                        batch.append(self.store.get(entry_id))
                    except EntryNotFoundError:
                        continue
                vectors = self.encoder.encode([e.query for e in batch]) if batch else []
                contexts = [e.context_query for e in batch if e.context_query]
                context_vectors = iter(self.encoder.encode(contexts)) if contexts else iter(())
                updated = [
                    e.with_vectors(v, next(context_vectors) if e.context_query else None,
                                   self.encoder.version)
                    for e, v in zip(batch, vectors, strict=True)
                ]
                if self._wrote(self.store.put_many(updated)):
                    for entry in updated:
                        self._index_entry(entry)
                done += len(stale[start:start + batch_size])
                if progress is not None:
                    progress(done, len(stale))
            self._stale = []
            return len(stale)

    def _maybe_fit_pca(self, progress: Progress | None) -> None:
        dims = self.settings.pca_dims
        if dims == 0 or self.encoder.pca is not None:
            return
        if len(self._index) < max(self.settings.pca_min_entries, dims):
            return
        self.fit_pca(progress)

    def fit_pca(self, progress: Progress | None = None) -> PCAProjection:
        """Fit the PCA layer on this user's cached query embeddings and re-embed under it."""
        with self._lock:
            base = self.encoder.with_pca(None) if self.encoder.pca is not None else self.encoder
            if base is self.encoder:  # the index already holds full embeddings
                full = self._index.vectors()
            else:
                full = base.encode([self.store.get(i).query for i in self._index.ids])
            pca = PCAProjection.fit(full, self.settings.pca_dims)
            pca.save(self._pca_dir / f"{pca.version}.safetensors")
            reduced = pca.project(full)
            reduced /= np.linalg.norm(reduced, axis=1, keepdims=True)
            self.thresholds.carry(*neighbour_similarities(self._index.vectors(), reduced))
            self.store.set_meta("pca", {"version": pca.version,
                                        "base_version": base.base_version})
            log.info("fitted PCA-%d on %d cached queries", pca.out_dim, len(full))
            self.set_encoder(base.with_pca(pca), progress)
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
                self.store.touch(replace(entry, rejections=entry.rejections + 1))
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
