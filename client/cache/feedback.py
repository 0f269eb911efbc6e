"""What the user's feedback teaches, decided once for re-tuning tau and for FL training.

Every served hit is stored as a weak positive pair (the user kept the answer); rejecting
it turns the same pair into a negative. An accepted exact repeat of a cached question
(same text, up to case and spaces) teaches nothing about where paraphrases end, so it is
left out; a rejected one still counts, since the cached answer was wrong.
"""

import time
from pathlib import Path
from typing import Any

from meancache.client.cache.results import Hit
from meancache.client.cache.store import EntryStore
from meancache.shared.pairs import Pair


def _record(hit: Hit, label: int, now: float) -> dict[str, Any]:
    """A pair as the store keeps it (plain builtins, readable by any version)."""
    return {"query": hit.query, "matched_query": hit.matched_query,
            "similarity": hit.similarity, "label": label, "weak": label == 1,
            "entry_id": hit.entry_id, "time": now}


def accepted(hit: Hit, now: float) -> dict[str, Any]:
    """The pair of a hit just served: positive until the user rejects it."""
    return _record(hit, 1, now)


def rejected(hit: Hit) -> dict[str, Any]:
    """The pair of a hit the user said was wrong (stored under the same hit id)."""
    return _record(hit, 0, time.time())


def _teaches(record: dict[str, Any]) -> bool:
    repeat = record["query"].strip().lower() == record["matched_query"].strip().lower()
    return record["label"] == 0 or not repeat


def labelled_pairs(store: EntryStore, newest: int | None = None) -> list[Pair]:
    """The pairs feedback teaches, oldest first; ``newest`` keeps only the last N."""
    records = sorted((r for r in store.pairs() if _teaches(r)), key=lambda r: r["time"])
    if newest is not None:
        records = records[-newest:]
    return [Pair(r["query"], r["matched_query"], int(r["label"])) for r in records]


def device_pairs(cache_dir: Path) -> list[Pair]:
    """The labelled pairs of the cache in ``cache_dir`` (none before it exists), for FL."""
    if not cache_dir.exists():
        return []
    store = EntryStore(cache_dir)
    try:
        return labelled_pairs(store)
    finally:
        store.close()
