"""The cache's policy at work: it follows the entries the cache holds, decides whether a
new one is stored and which ones leave, and re-clusters SCALM's patterns in a background
thread as the cache grows (never on the lookup path)."""

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from meancache.client.cache.entry import Entry
from meancache.client.cache.policy import eviction
from meancache.client.cache.policy.admission import admits
from meancache.client.cache.policy.patterns import PatternInput, fit_co_hsc, fit_se_hsc
from meancache.client.cache.policy.state import PatternState, load_patterns, save_patterns
from meancache.client.cache.store import EntryStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PolicySettings:
    policy: str = "lru"  # "lru", "lfu", "scalm-co" or "scalm-se"
    clustering: str = "kmeans"  # "kmeans" (fast) or "dbscan" (the paper's)
    patterns: int = 20  # K of CO-HSC, T_p of SE-HSC
    dbscan_eps: float = 0.3  # cosine distance
    prune_saving: float = 0.2  # SE-HSC's T_s
    prune_share: float = 0.05  # SE-HSC's T_e
    min_entries: int = 4  # fewer entries are not clustered
    regrow: float = 0.25  # re-cluster after inserts + hits reach this share of the entries
    min_events: int = 8  # ... and at least this many


@dataclass(frozen=True)
class _Tracked:
    vector: np.ndarray
    context: np.ndarray | None
    round_: int
    tokens: int  # query + answer
    prev_id: str | None
    created: float
    hits: int
    version: str
    pattern: int | None


class CachePolicy:
    """Admission, eviction and SCALM's patterns for one SemanticCache.

    Thread-safe: the cache calls it under its own lock, the re-clustering thread takes only
    this object's lock, to copy what it clusters and to install the result.
    """

    def __init__(self, store: EntryStore, settings: PolicySettings) -> None:
        self.settings = settings
        self.store = store
        self._lock = threading.Lock()
        self._tracked: dict[str, _Tracked] = {}
        self._version = ""  # encoder version of the newest tracked entry
        self._events = 0  # inserts and hits since the last fit
        self._thread: threading.Thread | None = None
        self.fit_seconds: list[float] = []
        stored = load_patterns(store) if self.uses_patterns else None
        self._state = stored if stored is not None and stored.policy == settings.policy \
            and stored.clustering == settings.clustering else None

    @property
    def uses_patterns(self) -> bool:
        return self.settings.policy.startswith("scalm")

    @property
    def state(self) -> PatternState | None:
        return self._state

    # following the entries ------------------------------------------------------------
    def _pattern(self, vector: np.ndarray, round_: int, version: str) -> int | None:
        state = self._state
        if state is None or state.encoder_version != version:
            return None
        return state.model.nearest(vector.astype(np.float32), round_)

    def track(self, entry: Entry) -> None:
        """The cache holds ``entry`` (new, loaded or re-embedded)."""
        with self._lock:
            self._version = entry.encoder_version
            self._tracked[entry.id] = _Tracked(
                entry.embedding.astype(np.float32),
                None if entry.context_embedding is None
                else entry.context_embedding.astype(np.float32),
                entry.turn, entry.query_tokens + entry.answer_tokens, entry.prev_id,
                entry.created, entry.hits, entry.encoder_version,
                self._pattern(entry.embedding, entry.turn, entry.encoder_version))

    def forget(self, entry_id: str) -> None:
        with self._lock:
            self._tracked.pop(entry_id, None)

    def forget_all(self) -> None:
        """The cache reloads its entries from the store: each will be tracked again."""
        with self._lock:
            self._tracked.clear()

    def hit(self, entry_id: str) -> None:
        """``entry_id`` was served: +1 to its LFU count, one more event towards a re-fit."""
        with self._lock:
            tracked = self._tracked.get(entry_id)
            if tracked is not None:
                self._tracked[entry_id] = replace(tracked, hits=tracked.hits + 1)
            self._events += 1
        self._maybe_recluster()

    def inserted(self) -> None:
        """An entry was stored: re-cluster in the background once enough has changed."""
        with self._lock:
            self._events += 1
        self._maybe_recluster()

    # decisions ------------------------------------------------------------------------
    def admits(self, entry: Entry, full: bool) -> bool:
        """Whether ``entry`` is stored (always, unless a SCALM policy and the cache is full)."""
        if not self.uses_patterns:
            return True
        with self._lock:
            state = self._state
            pattern = self._pattern(entry.embedding, entry.turn, entry.encoder_version)
        return admits(None if state is None else state.model, pattern, full)

    def victims(self, usage: Mapping[str, tuple[float, int]], over_count: int,
                over_bytes: int) -> list[str]:
        """Entries to evict so that ``over_count`` entries and ``over_bytes`` bytes go;
        ``usage`` is the cache's id -> (last used, bytes)."""
        with self._lock:
            state = self._state
            known = {}
            for entry_id, (last_used, nbytes) in usage.items():
                tracked = self._tracked.get(entry_id)
                priority = 0 if state is None or tracked is None \
                    else state.model.priority(tracked.pattern)
                known[entry_id] = eviction.Usage(
                    last_used, last_used if tracked is None else tracked.created,
                    0 if tracked is None else tracked.hits, nbytes, priority)
        return eviction.victims(self.settings.policy, known, over_count, over_bytes)

    # re-clustering --------------------------------------------------------------------
    def _maybe_recluster(self) -> None:
        if not self.uses_patterns:
            return
        with self._lock:
            size = len(self._tracked)
            stale = self._state is None or self._state.encoder_version != self._version
            due = self._events >= max(self.settings.min_events, self.settings.regrow * size)
            if size < self.settings.min_entries or not (due or stale):
                return
            if self._thread is not None and self._thread.is_alive():
                return
            self._events = 0
            self._thread = threading.Thread(target=self._recluster_logged, daemon=True,
                                             name="meancache-patterns")
            self._thread.start()

    def _recluster_logged(self) -> None:
        try:
            self.recluster()
        except Exception:  # a failed fit keeps the old patterns; the cache goes on
            log.exception("re-clustering the cache's semantic patterns failed")

    def _snapshot(self) -> tuple[list[str], PatternInput, str]:
        with self._lock:
            version = self._version
            ids = [i for i, t in self._tracked.items() if t.version == version]
            rows = [self._tracked[i] for i in ids]
            dim = rows[0].vector.shape[0] if rows else 0
            tokens = [t.tokens + (self._tracked[t.prev_id].tokens if t.round_ > 0
                                  and t.prev_id in self._tracked else 0) for t in rows]
        data = PatternInput(
            vectors=np.stack([t.vector for t in rows]) if rows else np.zeros((0, dim)),
            contexts=np.stack([t.context if t.context is not None else np.zeros(dim, np.float32)
                               for t in rows]) if rows else np.zeros((0, dim)),
            rounds=np.asarray([t.round_ for t in rows], dtype=np.int64),
            tokens=np.asarray(tokens, dtype=np.float64),
            hits=np.asarray([t.hits for t in rows], dtype=np.float64))
        return ids, data, version

    def recluster(self) -> PatternState | None:
        """Fit the patterns on the entries held now, install and store them (the background
        thread runs this; a caller may too, e.g. a benchmark that wants it synchronous)."""
        ids, data, version = self._snapshot()
        if len(ids) < self.settings.min_entries:
            return None
        s = self.settings
        started = time.perf_counter()
        if s.policy == "scalm-se":
            model = fit_se_hsc(data, s.patterns, s.clustering, s.dbscan_eps,
                               prune_saving=s.prune_saving, prune_share=s.prune_share)
        else:
            model = fit_co_hsc(data, s.patterns, s.clustering, s.dbscan_eps)
        seconds = time.perf_counter() - started
        state = PatternState(model, s.policy, s.clustering, version, len(ids), seconds)
        with self._lock:
            self._state = state
            self.fit_seconds.append(seconds)
            fitted = dict(zip(ids, model.labels.tolist(), strict=True))
            for entry_id, tracked in self._tracked.items():
                pattern = fitted.get(entry_id)
                if pattern is None:  # stored while the fit ran
                    pattern = self._pattern(tracked.vector, tracked.round_, tracked.version)
                self._tracked[entry_id] = replace(tracked, pattern=pattern)
        save_patterns(self.store, state)
        log.info("clustered %d entries into %d patterns (%s, %s) in %.3f s", len(ids),
                 len(model), s.policy, s.clustering, seconds)
        return state

    def wait(self) -> None:
        """Until a running re-clustering has finished."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def close(self) -> None:
        self.wait()
