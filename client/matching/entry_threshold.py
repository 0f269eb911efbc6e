"""Per-entry thresholds learned from feedback on the entry, the only reader and writer of
an entry's threshold evidence (in the spirit of vCache's verified per-entry thresholds).

One global tau fits the average entry; feedback tells where one entry's boundary lies.
An entry that was rejected at similarity s is never served again at s or below (its
threshold rises just above the highest similarity it was wrongly served at); an entry
that users keep accepting relaxes toward, never below, a floor ``RELAX`` under the
global tau. An entry without feedback uses the global tau. Exact repeats of the cached
question teach nothing about where paraphrases end, so accepting one relaxes nothing.

The evidence is kept with the entry (``Entry.threshold_evidence``, plain builtins), so it
is persisted, survives restarts and is deleted with the entry. Thresholds are computed
from it against the current global tau, so a new global tau moves every entry with it.
A rejection keeps the rejected question's text beside its similarity and the vector
space it was measured in: after a change of space (PCA fit, new encoder) the similarity
is re-scored in the new space on the entry's next lookup, not carried or forgotten.
"""

from dataclasses import dataclass, replace
from typing import Any, Protocol, TypeVar

import numpy as np
from meancache.shared.query import normalise_query

RELAX = 0.04  # the most an often-accepted entry's threshold falls under the global tau
ACCEPTS_TO_HALF_RELAX = 4  # accepted paraphrases that bring half of RELAX
MARGIN = 0.005  # how far above a rejected similarity the entry's threshold rises


class Judged(Protocol):
    """A stored question with its evidence (the cache's ``Entry``, a frozen dataclass)."""

    @property
    def query(self) -> str: ...

    @property
    def embedding(self) -> np.ndarray: ...

    @property
    def threshold_evidence(self) -> dict[str, Any] | None: ...


Entry = TypeVar("Entry", bound=Judged)


@dataclass(frozen=True)
class Evidence:
    """What feedback taught about one entry's boundary."""

    accepted: int = 0  # accepted hits that were not exact repeats
    rejected_query: str | None = None  # the question served at the highest wrong similarity
    rejected_similarity: float | None = None
    space: str | None = None  # the encoder version ``rejected_similarity`` was measured in

    @classmethod
    def of(cls, entry: Judged) -> "Evidence":
        record = entry.threshold_evidence or {}
        similarity = record.get("rejected_similarity")
        return cls(accepted=int(record.get("accepted", 0)),
                   rejected_query=record.get("rejected_query"),
                   rejected_similarity=None if similarity is None else float(similarity),
                   space=record.get("space"))

    def to_record(self) -> dict[str, object]:
        return {"accepted": self.accepted, "rejected_query": self.rejected_query,
                "rejected_similarity": self.rejected_similarity, "space": self.space}


def floor(global_tau: float) -> float:
    """The lowest threshold any entry may reach: where lookups start searching."""
    return global_tau - RELAX


def threshold(evidence: Evidence, global_tau: float) -> float:
    """The entry's threshold: relaxed by its accepted paraphrases, raised above its
    highest rejected similarity."""
    tau = global_tau - RELAX * evidence.accepted / (evidence.accepted + ACCEPTS_TO_HALF_RELAX)
    if evidence.rejected_similarity is not None:
        tau = max(tau, evidence.rejected_similarity + MARGIN)
    return tau


def _is_repeat(query: str, cached_query: str) -> bool:
    return normalise_query(query) == normalise_query(cached_query)


def after_accept(entry: Entry, query: str) -> Entry:
    """The entry after serving ``query`` from it (a hit counts as accepted until rejected)."""
    if _is_repeat(query, entry.query):
        return entry
    evidence = Evidence.of(entry)
    return _with(entry, replace(evidence, accepted=evidence.accepted + 1))


def after_reject(entry: Entry, query: str, similarity: float, space: str) -> Entry:
    """The entry after the user rejected ``query``'s hit at ``similarity`` in ``space``:
    the hit no longer counts as accepted, and the highest wrong similarity is kept."""
    evidence = Evidence.of(entry)
    if not _is_repeat(query, entry.query):
        evidence = replace(evidence, accepted=max(0, evidence.accepted - 1))
    if evidence.space != space or evidence.rejected_similarity is None \
            or similarity >= evidence.rejected_similarity:
        evidence = replace(evidence, rejected_query=query,
                           rejected_similarity=float(similarity), space=space)
    return _with(entry, evidence)


def needs_rescoring(entry: Judged, space: str) -> bool:
    """Whether the entry's rejected similarity was measured in another vector space."""
    evidence = Evidence.of(entry)
    return evidence.rejected_query is not None and evidence.space != space


def rescored(entry: Entry, query_vector: np.ndarray, space: str) -> Entry:
    """The entry with its rejected similarity re-measured in ``space``, where
    ``query_vector`` is the rejected question's vector and the entry's is stored."""
    similarity = float(np.dot(query_vector, entry.embedding.astype(np.float32)))
    return _with(entry, replace(Evidence.of(entry), rejected_similarity=similarity, space=space))


def _with(entry: Entry, evidence: Evidence) -> Entry:
    return replace(entry, threshold_evidence=evidence.to_record())
