"""The one home of SCALM's state on disk: the fitted patterns and the query log they were
learnt from, as records in the cache's store, so a restart (or another process) ranks with
the same patterns and keeps learning from the same log."""

from dataclasses import dataclass

import numpy as np
from meancache.client.cache.policy.patterns import PatternModel
from meancache.client.cache.policy.query_log import QueryLog
from meancache.client.cache.store import EntryStore

_NAME = "patterns"
_LOG = "pattern_log"


@dataclass(frozen=True)
class PatternState:
    """A fitted model and what it was fitted under."""

    model: PatternModel
    policy: str  # "scalm-co" or "scalm-se"
    clustering: str  # "kmeans" or "dbscan"
    encoder_version: str  # the space of its centroids
    queries: int  # logged queries it was fitted on
    seconds: float  # how long the fit took


def save_log(store: EntryStore, record: dict[str, object]) -> None:
    """A QueryLog's record (``QueryLog.to_record``)."""
    store.set_state(_LOG, record)


def save_patterns(store: EntryStore, state: PatternState) -> None:
    model = state.model
    store.set_state(_NAME, {
        "policy": state.policy, "clustering": state.clustering,
        "encoder_version": state.encoder_version, "queries": state.queries,
        "seconds": state.seconds, "dim": int(model.centroids.shape[1]),
        "centroids": model.centroids.astype(np.float32).tobytes(),
        "rounds": [int(r) for r in model.rounds], "ratios": [float(r) for r in model.ratios],
        "ranks": list(model.ranks),
    })


def load_patterns(store: EntryStore) -> PatternState | None:
    """The stored patterns, or None when there are none or the record cannot be read (a
    re-clustering replaces it: patterns are derived state, never worth an error)."""
    record = store.get_meta(_NAME)
    if not isinstance(record, dict):
        return None
    try:
        centroids = np.frombuffer(record["centroids"], dtype=np.float32)
        model = PatternModel(
            centroids.reshape(-1, int(record["dim"])).copy(),
            np.asarray(record["rounds"], dtype=np.int64),
            np.asarray(record["ratios"], dtype=np.float64), tuple(record["ranks"]),
            labels=np.zeros(0, dtype=np.int64))
        return PatternState(model, str(record["policy"]), str(record["clustering"]),
                            str(record["encoder_version"]), int(record["queries"]),
                            float(record["seconds"]))
    except (KeyError, TypeError, ValueError):
        return None


def load_log(store: EntryStore, capacity: int) -> QueryLog:
    """The stored query log; an empty one when there is none or it cannot be read."""
    record = store.get_meta(_LOG)
    if isinstance(record, dict):
        try:
            return QueryLog.from_record(record, capacity)
        except (KeyError, TypeError, ValueError):
            pass
    return QueryLog(capacity)
