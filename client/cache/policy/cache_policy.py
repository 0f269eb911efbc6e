"""The cache's policy at work: it follows the entries the cache holds and the queries it is
asked, decides whether a new entry is stored and which ones leave, and re-clusters SCALM's
patterns in a background thread as queries arrive (never on the lookup path)."""

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace

import numpy as np
from meancache.client.cache.entry import Entry
from meancache.client.cache.policy import eviction
from meancache.client.cache.policy.admission import admits
from meancache.client.cache.policy.patterns import fit_co_hsc, fit_se_hsc
from meancache.client.cache.policy.state import (
    PatternState,
    load_log,
    load_patterns,
    save_log,
    save_patterns,
)
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
    history: int = 2000  # queries in the log the patterns are learnt from
    min_queries: int = 4  # fewer logged queries are not clustered
    regrow: float = 0.25  # re-cluster after this share of the log is new ...
    min_events: int = 16  # ... and at least this many queries


@dataclass(frozen=True)
class _Tracked:
    """A held entry, as eviction and the query log need it."""

    vector: np.ndarray
    context: np.ndarray | None
    round_: int
    tokens: int  # query + answer (+ context for a follow-up)
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
        self._events = 0  # queries logged since the last fit
        self._thread: threading.Thread | None = None
        self.fit_seconds: list[float] = []
        self._state: PatternState | None = None
        self._log = load_log(store, settings.history) if self.uses_patterns else None
        stored = load_patterns(store) if self.uses_patterns else None
        if stored is not None and (stored.policy, stored.clustering) == (
                settings.policy, settings.clustering):
            self._state = stored

    @property
    def uses_patterns(self) -> bool:
        return self.settings.policy.startswith("scalm")

    @property
    def state(self) -> PatternState | None:
        return self._state

    @property
    def logged(self) -> int:
        return 0 if self._log is None else len(self._log)

    # following the entries and the queries --------------------------------------------
    def _pattern(self, vector: np.ndarray, round_: int, version: str) -> int | None:
        state = self._state
        if state is None or state.encoder_version != version:
            return None
        return state.model.nearest(vector.astype(np.float32), round_)

    def _tokens(self, entry: Entry) -> int:
        """Tokens one answer of ``entry`` costs, with its context's when that is held."""
        context = self._tracked.get(entry.prev_id or "") if entry.turn > 0 else None
        own = entry.query_tokens + entry.answer_tokens
        return own + (context.tokens if context is not None else 0)

    def track(self, entry: Entry) -> None:
        """The cache holds ``entry`` (new, loaded or re-embedded)."""
        with self._lock:
            self._tracked[entry.id] = _Tracked(
                entry.embedding.astype(np.float32),
                None if entry.context_embedding is None
                else entry.context_embedding.astype(np.float32),
                entry.turn, self._tokens(entry), entry.created, entry.hits,
                entry.encoder_version,
                self._pattern(entry.embedding, entry.turn, entry.encoder_version))

    def forget(self, entry_id: str) -> None:
        with self._lock:
            self._tracked.pop(entry_id, None)

    def forget_all(self) -> None:
        """The cache reloads its entries from the store: each will be tracked again."""
        with self._lock:
            self._tracked.clear()

    def asked(self, entry: Entry, threshold: float) -> None:
        """The upstream answered ``entry``'s query (whether or not it is stored): log it, as
        a repeat when an earlier logged query is as similar as ``threshold``."""
        if self._log is None:
            return
        with self._lock:
            repeat = self._log.is_repeat(entry.embedding, threshold, entry.encoder_version)
            self._log.add(entry.embedding, entry.context_embedding, entry.turn,
                          self._tokens(entry), repeat, entry.encoder_version)
            self._events += 1
        self._maybe_recluster()

    def hit(self, entry_id: str) -> None:
        """``entry_id`` was served: +1 to its LFU count, and a repeat in the query log."""
        with self._lock:
            tracked = self._tracked.get(entry_id)
            if tracked is None:
                return
            self._tracked[entry_id] = replace(tracked, hits=tracked.hits + 1)
            if self._log is not None:
                self._log.add(tracked.vector, tracked.context, tracked.round_, tracked.tokens,
                              True, tracked.version)
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
        with self._lock:
            if self._log is None or len(self._log) < self.settings.min_queries:
                return
            stale = self._state is None or self._state.encoder_version != self._log.version
            due = self._events >= max(self.settings.min_events,
                                      self.settings.regrow * len(self._log))
            if not (due or stale) or (self._thread is not None and self._thread.is_alive()):
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

    def recluster(self) -> PatternState | None:
        """Fit the patterns on the logged queries, install and store them (the background
        thread runs this; a caller may too, e.g. a benchmark that wants it synchronous)."""
        if self._log is None:
            return None
        with self._lock:
            data, version, record = (self._log.patterns_input(), self._log.version,
                                     self._log.to_record())
        if len(data.rounds) < self.settings.min_queries:
            return None
        s = self.settings
        started = time.perf_counter()
        if s.policy == "scalm-se":
            model = fit_se_hsc(data, s.patterns, s.clustering, s.dbscan_eps,
                               prune_saving=s.prune_saving, prune_share=s.prune_share)
        else:
            model = fit_co_hsc(data, s.patterns, s.clustering, s.dbscan_eps)
        seconds = time.perf_counter() - started
        state = PatternState(model, s.policy, s.clustering, version, len(data.rounds), seconds)
        with self._lock:
            self._state = state
            self.fit_seconds.append(seconds)
            for entry_id, tracked in self._tracked.items():
                self._tracked[entry_id] = replace(tracked, pattern=self._pattern(
                    tracked.vector, tracked.round_, tracked.version))
        save_patterns(self.store, state)
        save_log(self.store, record)
        log.info("clustered %d queries into %d patterns (%s, %s) in %.3f s",
                 len(data.rounds), len(model), s.policy, s.clustering, seconds)
        return state

    def wait(self) -> None:
        """Until a running re-clustering has finished."""
        thread = self._thread
        if thread is not None:
            thread.join()

    def close(self) -> None:
        """Waits for a running fit and keeps the query log for the next start."""
        self.wait()
        if self._log is not None and len(self._log):
            with self._lock:
                record = self._log.to_record()
            save_log(self.store, record)
