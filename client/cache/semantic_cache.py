"""The semantic cache: embed the query, find the most similar cached queries, serve an
answer when the conversational context agrees and the ``Matcher`` accepts it (tau or the
entry's own threshold, then verification: client/cache/matcher.py). The cache owns its
vector space (the encoder pipeline: base model, global weights, PCA) and its matcher."""

import contextlib
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import replace
from functools import partial
from pathlib import Path

import numpy as np
from meancache.client.cache import entry_threshold, feedback
from meancache.client.cache.background import BackgroundWork
from meancache.client.cache.context import SAME, context_agrees, same_context
from meancache.client.cache.entry import STORED_DTYPE, Context, Entry
from meancache.client.cache.index import VectorIndex
from meancache.client.cache.matcher import (
    NOTHING_CLOSE,
    Candidate,
    Match,
    Matcher,
    NoMatch,
    Verifier,
    embed_texts,
)
from meancache.client.cache.policy.cache_policy import CachePolicy, PolicySettings
from meancache.client.cache.results import CacheStats, Hit, Miss, ThresholdChange
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.source import CacheOrigin, Source
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import cache_stats
from meancache.client.cache.threshold import ThresholdState
from meancache.client.errors import EntryNotFoundError
from meancache.shared.encoder import Encoder, PCAProjection
from meancache.shared.encoder.pca import neighbour_similarities
from meancache.shared.progress import Progress
from meancache.shared.query import clean_query

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
        verifier: Verifier | None = None,
    ) -> None:
        """``verifier``: the shipped learned one unless another is given."""
        self.settings = settings or CacheSettings()
        self.store = EntryStore(Path(directory))
        self._pca_dir = Path(directory) / "pca"
        self._lock = threading.RLock()
        self._space_lock = threading.Lock()  # one change of vector space at a time
        self.background = BackgroundWork()
        self._in_background = background
        self.policy = CachePolicy(self.store, PolicySettings(
            self.settings.eviction_policy, self.settings.pattern_clustering))
        self.thresholds = ThresholdState(self.store, self.settings.global_threshold)
        self.thresholds.persist_default()
        self.matcher = Matcher(self._with_stored_pca(encoder), self.thresholds, self.store,
                               self.settings.matching, verifier)
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

    # the vector space ---------------------------------------------------------------
    @property
    def encoder(self) -> Encoder:
        """The whole pipeline of the current vector space (base model, global weights,
        PCA; ``version`` fingerprints all three). The matcher embeds with it."""
        return self.matcher.encoder

    @encoder.setter
    def encoder(self, encoder: Encoder) -> None:
        self.matcher.encoder = encoder

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
        """Run on ``encoder``'s model (e.g. after an FL sync), with the PCA layer this cache
        fitted for that model put back unless ``encoder`` brings its own; every entry is
        re-embedded only when that changes the vector space. Returns how many moved."""
        with self._space_lock:
            if encoder.pca is None:
                encoder = self._with_stored_pca(encoder)
            if encoder.version == self.encoder.version:
                return 0
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
            self._bound: set[str] = set()  # entries that answer only in their own context
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
        if entry.context_bound:
            self._bound.add(entry.id)
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

    # lookup -------------------------------------------------------------------------
    @property
    def threshold(self) -> float:
        """The tau lookups use now (see ``thresholds`` for both values)."""
        return self.thresholds.current

    def lookup(self, query: str | bytes, context: Context | None = None) -> Hit | Miss:
        """The cached answer the matcher accepts for ``query`` in ``context``, or a miss
        that says why."""
        query = clean_query(query)
        with self._lock:
            self._sync()
            question = self.matcher.question(query)
            found, best = self._index.search(question.vector, self.settings.candidates,
                                             min_score=self.matcher.floor)
            context_vector = self._context_vector(context)
            tau = self.threshold
            decision = self.matcher.decide(question,
                                           self._candidates(found, context_vector, tau))
            if isinstance(decision, Match):
                with contextlib.suppress(EntryNotFoundError):  # deleted by another process
                    return self._serve(query, decision.candidate, question.truncated)
            self.store.add_to_counter("misses")
            reason = decision.reason if isinstance(decision, NoMatch) else NOTHING_CLOSE
            if isinstance(decision, NoMatch) and decision.vetoed:
                return Miss(query, reason, decision.best_similarity, question.truncated, True)
            if reason == NOTHING_CLOSE and best is not None and best >= tau:
                reason = "similar queries were asked in another context"
            return Miss(query, reason, best, question.truncated)

    def _context_vector(self, context: Context | None) -> np.ndarray | None:
        """The previous question's vector (None for a first turn, or without context rules)."""
        if not self.settings.context_aware or context is None or not context.is_follow_up:
            return None
        return self.matcher.embed(clean_query(context.prev_query or ""))

    def _candidates(self, found: list[tuple[str, float]], context_vector: np.ndarray | None,
                    tau: float) -> Iterator[Candidate]:
        """The entries found, best first, less those asked in another context
        (client/cache/context.py); each read only when the matcher gets to it."""
        for entry_id, similarity in found:
            if self.settings.context_aware and not context_agrees(
                    self._context_vectors.get(entry_id), context_vector, tau,
                    self._index.vector(entry_id), entry_id in self._bound):
                continue
            try:
                entry = self.store.get(entry_id)
            except EntryNotFoundError:  # deleted by another process since our last sync
                continue
            yield Candidate(entry_id, entry.query, similarity,
                            self._evidence(entry) if self.settings.entry_thresholds else None)

    def _evidence(self, entry: Entry) -> entry_threshold.Evidence:
        """What the entry's own threshold rests on, its rejected similarity first re-scored
        in the current vector space if it was measured in another."""
        if entry_threshold.needs_rescoring(entry, self.encoder.version):
            rejected = self.matcher.embed(
                entry_threshold.Evidence.of(entry).rejected_query or "")
            entry = entry_threshold.rescored(entry, rejected, self.encoder.version)
            self.store.touch(entry)
        return entry_threshold.Evidence.of(entry)

    def _serve(self, query: str, candidate: Candidate, truncated: bool) -> Hit:
        entry = self.store.get(candidate.key)
        now = time.time()
        entry = replace(entry_threshold.after_accept(entry, query), hits=entry.hits + 1,
                        last_hit=now)
        hit = Hit(query, entry.answer, entry.query, candidate.similarity, entry.id,
                  entry.source, uuid.uuid4().hex, truncated)
        self.store.record_hit(entry, hit.hit_id, self.matcher.pair(query, hit.origin, 1))
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
        asked_by: str | None = None,
    ) -> Entry:
        """Store an answer (``asked_by``: the app that asked, for `cache list`). Token counts
        default to the encoder tokenizer's count. A full cache
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
                embedding=self.matcher.embed(query).astype(STORED_DTYPE),
                encoder_version=self.encoder.version,
                context_query=context_query,
                context_embedding=None if context_query is None
                else self.matcher.embed(context_query).astype(STORED_DTYPE),
                conversation_id=context.conversation_id, turn=context.turn,
                prev_id=context.prev_entry_id, source=source,
                query_tokens=self.encoder.count_tokens(query) if query_tokens is None
                else query_tokens,
                answer_tokens=self.encoder.count_tokens(answer) if answer_tokens is None
                else answer_tokens,
                asked_by=asked_by,
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
        self._bound.discard(entry_id)
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
            full = current if in_full_space \
                else embed_texts(base, [e.query for e in self._read(ids)])
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
    def reject(self, query: str, origin: CacheOrigin, context: Context | None = None
               ) -> ThresholdChange:
        """The user says the answer served for ``query`` (asked in ``context``) from
        ``origin`` was wrong. Once per hit:

        - the same question (similarity >= ``context.SAME``) served in another context: the
          context was wrong, not tau. The entry is bound to its own context, and the hit's
          pair is kept out of what tunes tau and trains FL (it says nothing about where
          paraphrases end); tau stays;
        - otherwise the entry's own threshold rises above the similarity, a negative pair
          is recorded and tau re-tuned (``Matcher.rejected``).

        The caller then fetches a fresh answer, bypassing the cache."""
        with self._lock:
            if self.matcher.already_rejected(origin):
                return self.matcher.rejected(query, origin)  # records nothing again
            try:
                entry = self.store.get(origin.entry_id)
            except EntryNotFoundError:
                return self.matcher.rejected(query, origin)
            entry = replace(entry, rejections=entry.rejections + 1)
            if self.settings.context_aware and origin.similarity >= SAME and not same_context(
                    entry.context_embedding, self._context_vector(context)):
                return self._bind_to_context(query, origin, entry)
            self.store.touch(entry_threshold.after_reject(entry, query, origin.similarity,
                                                          self.encoder.version))
            return self.matcher.rejected(query, origin)

    def _bind_to_context(self, query: str, origin: CacheOrigin, entry: Entry
                         ) -> ThresholdChange:
        """A rejection the context rule learns from, not tau."""
        if self._wrote(self.store.put(replace(entry, context_bound=True))):
            self._bound.add(entry.id)
        self.store.put_pair(origin.hit_id, feedback.context_record(
            feedback.record(query, origin.matched_query, origin.similarity,
                            origin.feedback_key, 0, time.time())))
        self.store.add_to_counter("rejections")
        labels = [pair.label for pair in feedback.labelled_pairs(self.store)]
        tau = self.threshold
        return ThresholdChange(tau, tau, sum(labels), len(labels) - sum(labels),
                               "the same question in another conversation: the entry now "
                               "answers only after the question it was first asked after")

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
    vectors = embed_texts(encoder, [e.query for e in entries])
    asked = [e.context_query for e in entries if e.context_query]
    found = iter(embed_texts(encoder, asked)) if asked else iter(())
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
