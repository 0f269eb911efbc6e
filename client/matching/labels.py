"""What the user's feedback teaches, decided once for re-tuning tau and for FL training.

Every served match (a cache hit, a pack answer) is stored as a weak positive pair (the
user kept the answer); rejecting it turns the same pair into a negative. An accepted
exact repeat of a stored question (the same question, ``normalise_query``) teaches
nothing about where paraphrases end, so it is left out; a rejected one still counts,
since the served answer was wrong.
"""

from typing import Any, Protocol

from meancache.shared.pairs import Pair
from meancache.shared.query import normalise_query

DECLINED = "declined:"  # counter prefix: near matches the verifier vetoed, by reason


class PairStore(Protocol):
    """Where the labelled pairs are kept (the cache's ``EntryStore``), with the counters a
    decision and its feedback add to."""

    def put_pair(self, pair_id: str, pair: dict[str, Any]) -> None: ...

    def get_pair(self, pair_id: str) -> dict[str, Any] | None: ...

    def pairs(self) -> list[dict[str, Any]]: ...

    def add_to_counter(self, name: str, delta: int = 1) -> int: ...


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


def labelled_pairs(store: PairStore, newest: int | None = None) -> list[Pair]:
    """The pairs feedback teaches, oldest first; ``newest`` keeps only the last N."""
    records = sorted((r for r in store.pairs() if _teaches(r)), key=lambda r: r["time"])
    if newest is not None:
        records = records[-newest:]
    return [Pair(r["query"], r["matched_query"], int(r["label"])) for r in records]
