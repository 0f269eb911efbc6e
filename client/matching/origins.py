"""Where an answer came from.

``Source`` is the one enum for cache entries, badges and exports: a StrEnum whose values
are what older caches and conversation files hold, so those still load and the JSON stays
readable. A turn records more than the kind: its typed origin (a pack entry, a cache
entry, an upstream response) names what feedback on the answer must reach.
"""

from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any


class Source(StrEnum):
    UPSTREAM = "upstream"  # asked the LLM server
    CACHE = "cache"  # served from this device's semantic cache
    PACK = "pack"  # served from a shared cache pack
    USER_CORRECTED = "user-corrected"  # the upstream's answer after the user rejected a hit

    @property
    def from_cache(self) -> bool:
        """Served from a cache, so the user may reject it as wrong."""
        return self in (Source.CACHE, Source.PACK)


@dataclass(frozen=True)
class CacheOrigin:
    """Served from the semantic cache's entry ``entry_id``."""

    hit_id: str  # the served hit: its feedback pair is stored under this id
    entry_id: str
    matched_query: str
    similarity: float

    source = Source.CACHE

    @property
    def feedback_key(self) -> str:
        """What the labelled pair names as the answer's holder."""
        return self.entry_id


@dataclass(frozen=True)
class PackOrigin:
    """Served from the instruction pack ``pack_id``: the very question (``exact``) or a
    similar instruction."""

    hit_id: str
    pack_id: str
    instruction: str  # normalised, as the pack keys it
    similarity: float  # 1.0 for an exact match
    exact: bool

    source = Source.PACK

    @property
    def matched_query(self) -> str:
        return self.instruction

    @property
    def feedback_key(self) -> str:
        return f"pack:{self.pack_id}"


@dataclass(frozen=True)
class UpstreamOrigin:
    """Asked the upstream; ``entry_id`` is the cache entry that stored the answer (None
    when nothing was stored: an empty answer, one about attached documents)."""

    entry_id: str | None = None

    source = Source.UPSTREAM


Matched = CacheOrigin | PackOrigin  # an answer found by a match: the user may reject it
Origin = CacheOrigin | PackOrigin | UpstreamOrigin
NOT_REJECTABLE = "only an answer served from a cache, or an empty one, can be marked wrong"


def rejectable(origin: Origin, empty: bool) -> bool:
    """Whether "wrong answer" may take an answer: a match served from a cache (a false
    hit, which feedback learns from) or an empty answer (asked again). The one rule, for
    the chat's key, the proxy's feedback and the answer service."""
    return isinstance(origin, CacheOrigin | PackOrigin) or empty

_KINDS: dict[str, type[CacheOrigin] | type[PackOrigin] | type[UpstreamOrigin]] = {
    "cache": CacheOrigin, "pack": PackOrigin, "upstream": UpstreamOrigin}


def origin_to_json(origin: Origin) -> dict[str, Any]:
    kind = next(name for name, cls in _KINDS.items() if isinstance(origin, cls))
    return {"kind": kind, **asdict(origin)}


def origin_from_json(record: dict[str, Any]) -> Origin:
    fields = dict(record)
    kind = fields.pop("kind", None)
    if kind not in _KINDS:
        raise ValueError(f"unknown answer origin {kind!r}")
    return _KINDS[kind](**fields)
