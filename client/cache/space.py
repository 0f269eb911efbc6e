"""The cache's vector space: the encoder pipeline its entries are embedded in (base
model, global weights, PCA; ``Encoder.version`` fingerprints all three), and every change
of it (a new encoder after an FL sync, a PCA fit, entries stored under another encoder),
the only code that switches it.

A change is computed off the cache's lock: lookups keep using the current space until the
new one is complete, one change at a time (``_space_lock``). ``background=True`` (the
chat) also moves that work off the calling thread, with its progress in ``background``.
The matcher embeds in the current space (``Matcher.encoder``); only this module sets it.
"""

import logging
import threading
from collections.abc import Callable
from functools import partial
from pathlib import Path

import numpy as np
from meancache.client.background import BackgroundWork
from meancache.client.cache.entries import CachedEntries
from meancache.client.cache.entry import Entry
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.store import EntryStore
from meancache.client.cache.threshold import ThresholdState
from meancache.client.matching.matcher import Matcher
from meancache.client.matching.question import embed_texts
from meancache.shared.encoder import Encoder, PCAProjection
from meancache.shared.encoder.pca import neighbour_similarities
from meancache.shared.progress import Progress

log = logging.getLogger(__name__)

# Vectors for a batch of entries in some space: (queries (n, dim), each context or None).
VectorsOf = Callable[[list[Entry]], tuple[np.ndarray, list[np.ndarray | None]]]


class VectorSpace:
    def __init__(self, directory: Path, store: EntryStore, settings: CacheSettings,
                 matcher: Matcher, thresholds: ThresholdState, *, background: bool = False
                 ) -> None:
        self.store = store  # the PCA layer's meta key
        self.settings = settings
        self.matcher = matcher
        self.thresholds = thresholds  # carried into a new PCA space
        self._pca_dir = directory / "pca"
        self._space_lock = threading.Lock()  # one change of vector space at a time
        self.background = BackgroundWork()
        self._in_background = background
        self.entries: CachedEntries  # set by ``attach``: the view built in this space
        matcher.encoder = self.with_stored_pca(matcher.encoder)  # the PCA layer fitted here

    def attach(self, entries: CachedEntries, progress: Progress | None) -> None:
        """Work on ``entries``; those stored in another space are re-embedded now."""
        self.entries = entries
        if entries.stale:
            self._run_job("re-embedding cached questions", self.reembed, progress)

    @property
    def encoder(self) -> Encoder:
        return self.matcher.encoder

    def with_stored_pca(self, encoder: Encoder) -> Encoder:
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

    def sync(self) -> None:
        """Catch up with another process's writes (under the cache's lock)."""
        if not self.entries.changed():
            return
        stored = self.store.get_meta("pca")
        current = self.encoder.pca.version if self.encoder.pca is not None else None
        if stored and stored.get("version") != current and self.settings.pca_dims:
            # Another process fitted a PCA layer (and re-embedded): adopt it.
            base = self.encoder.with_pca(None) if self.encoder.pca is not None else self.encoder
            self.matcher.encoder = self.with_stored_pca(base)
        self.entries.load()

    def set_encoder(self, encoder: Encoder, progress: Progress | None = None) -> int:
        """Run on ``encoder``'s model (e.g. after an FL sync), with the PCA layer this cache
        fitted for that model put back unless ``encoder`` brings its own; every entry is
        re-embedded only when that changes the vector space. Returns how many moved."""
        with self._space_lock:
            if encoder.pca is None:
                encoder = self.with_stored_pca(encoder)
            if encoder.version == self.encoder.version:
                return 0
            return self._switch(encoder, partial(_encode_entries, encoder), progress)

    def _run_job(self, label: str, job: Callable[[Progress | None], object],
                 progress: Progress | None) -> None:
        if self._in_background:
            self.background.start(label, job)
        else:
            job(progress)

    def reembed(self, progress: Progress | None = None) -> int:
        """Re-embed the entries stored under another encoder version; each becomes
        searchable as soon as its batch is written."""
        with self._space_lock:
            with self.entries.lock:
                self.sync()
                stale, encoder = sorted(self.entries.stale), self.encoder
            return self._move(stale, encoder, partial(_encode_entries, encoder), progress)

    def _switch(self, encoder: Encoder, vectors_of: VectorsOf, progress: Progress | None,
                on_switch: Callable[[], None] | None = None) -> int:
        """Move every entry into ``encoder``'s space, then make it the current one (after
        ``on_switch``, under the lock, for state that must change at the same moment)."""
        with self.entries.lock:
            self.sync()
            ids = self.entries.ids
        moved = self._move(ids, encoder, vectors_of, progress)
        with self.entries.lock:
            self.matcher.encoder = encoder
            if on_switch is not None:
                on_switch()
            self.entries.load()
            arrived = sorted(self.entries.stale)
        if arrived:  # inserted in the old space while we worked: a handful at most
            self._move(arrived, encoder, partial(_encode_entries, encoder), None)
        return moved

    def _move(self, ids: list[str], encoder: Encoder, vectors_of: VectorsOf,
              progress: Progress | None, batch_size: int = 64) -> int:
        """Write the entries ``ids`` with vectors in ``encoder``'s space, a batch at a time.

        The vectors are computed off the lock, so lookups go on meanwhile. Each batch is
        written from the entry as stored at that moment: hits recorded meanwhile are kept,
        entries deleted meanwhile stay deleted.
        """
        entries = self.entries
        for start in range(0, len(ids), batch_size):
            batch = entries.read(ids[start:start + batch_size])
            vectors, contexts = vectors_of(batch) if batch else (np.empty((0, 0)), [])
            moved = {e.id: (v, c) for e, v, c in zip(batch, vectors, contexts, strict=True)}
            with entries.lock:
                entries.moved([e.with_vectors(*moved[e.id], encoder.version)
                               for e in entries.read(list(moved))],
                              searchable=encoder is self.encoder)
            if progress is not None:
                progress(min(start + batch_size, len(ids)), len(ids))
        return len(ids)

    def maybe_fit_pca(self, progress: Progress | None) -> None:
        dims = self.settings.pca_dims
        if dims == 0 or self.encoder.pca is not None or self._space_lock.locked():
            return
        if len(self.entries.index) < max(self.settings.pca_min_entries, dims):
            return
        self._run_job("fitting PCA on cached questions", self.fit_pca, progress)

    def fit_pca(self, progress: Progress | None = None) -> PCAProjection:
        """Fit the PCA layer on this user's cached query embeddings and move every entry
        into its space. Vectors stored in the full space are projected, not re-embedded,
        so this takes seconds even for a large cache."""
        with self._space_lock:
            with self.entries.lock:
                self.sync()
                base = self.encoder.with_pca(None) if self.encoder.pca is not None \
                    else self.encoder
                index = self.entries.index
                ids, current = index.ids, index.vectors()
                in_full_space = base is self.encoder
            full = current if in_full_space \
                else embed_texts(base, [e.query for e in self.entries.read(ids)])
            pca = PCAProjection.fit(full, self.settings.pca_dims)
            pca.save(self._pca_dir / f"{pca.version}.safetensors")
            target = base.with_pca(pca)
            carried = neighbour_similarities(current, target.project(full))

            def switched() -> None:
                self.thresholds.carry(*carried)
                self.store.set_meta("pca", {"version": pca.version,
                                            "base_version": base.base_version})

            self._switch(target, partial(_project_entries, base, target), progress, switched)
            log.info("fitted PCA-%d on %d cached queries", pca.out_dim, len(full))
            return pca


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
