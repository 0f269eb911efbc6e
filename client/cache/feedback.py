"""What the user's feedback teaches, decided once for re-tuning tau and for FL training.

Every served match (a cache hit, a pack answer) is stored as a weak positive pair (the
user kept the answer); rejecting it turns the same pair into a negative. An accepted
exact repeat of a stored question (the same question, ``normalise_query``) teaches
nothing about where paraphrases end, so it is left out; a rejected one still counts,
since the served answer was wrong.
"""

from collections.abc import Iterable
from contextlib import closing
from pathlib import Path
from typing import Any

from meancache.client.cache.store import EntryStore
from meancache.shared.pairs import Pair
from meancache.shared.query import normalise_query


def record(query: str, matched_query: str, similarity: float, key: str, label: int,
           now: float) -> dict[str, Any]:
    """A pair as the store keeps it (plain builtins, readable by any version); ``key`` names
    what held the answer (a cache entry id, ``pack:<id>``)."""
    return {"query": query, "matched_query": matched_query, "similarity": similarity,
            "label": label, "weak": label == 1, "entry_id": key, "time": now}


def context_record(record: dict[str, Any]) -> dict[str, Any]:
    """A rejected hit whose fault was the conversation, not the match (the same question
    in another context): kept, so that the hit counts as rejected once, but it teaches
    neither tau nor FL: the two questions do mean the same out of context."""
    return record | {"context": True}


def _teaches(record: dict[str, Any]) -> bool:
    if record.get("context"):
        return False
    repeat = normalise_query(record["query"]) == normalise_query(record["matched_query"])
    return record["label"] == 0 or not repeat


def labelled_pairs(store: EntryStore, newest: int | None = None) -> list[Pair]:
    """The pairs feedback teaches, oldest first; ``newest`` keeps only the last N."""
    records = sorted((r for r in store.pairs() if _teaches(r)), key=lambda r: r["time"])
    if newest is not None:
        records = records[-newest:]
    return [Pair(r["query"], r["matched_query"], int(r["label"])) for r in records]


def device_pairs(cache_dirs: Iterable[Path]) -> list[Pair]:
    """The labelled pairs of the caches in ``cache_dirs`` (none of one that does not
    exist), one cache after another, for FL: the device's own training data."""
    pairs: list[Pair] = []
    for cache_dir in cache_dirs:
        if cache_dir.exists():
            with closing(EntryStore(cache_dir)) as store:
                pairs += labelled_pairs(store)
    return pairs
