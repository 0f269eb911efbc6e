"""The persistent, context-aware semantic cache (public API).

SemanticCache and CacheSettings are imported on first use (PEP 562): their module pulls in
the encoder's torch layers, which commands that only read the store never need.
"""

from typing import TYPE_CHECKING

from meancache.client.cache.entry import Context, Entry
from meancache.client.cache.results import CacheStats, Hit, Miss, ThresholdChange
from meancache.client.cache.source import Source
from meancache.client.cache.store import repair
from meancache.client.errors import (
    CacheAccessError,
    CacheCorruptError,
    CacheError,
    CacheVersionError,
    EntryNotFoundError,
)

if TYPE_CHECKING:
    from meancache.client.cache.semantic_cache import CacheSettings, SemanticCache

__all__ = [
    "CacheAccessError", "CacheCorruptError", "CacheError", "CacheSettings", "CacheStats",
    "CacheVersionError", "Context", "Entry", "EntryNotFoundError", "Hit", "Miss",
    "SemanticCache", "Source", "ThresholdChange", "repair",
]


def __getattr__(name: str) -> object:
    if name in ("CacheSettings", "SemanticCache"):
        from meancache.client.cache import semantic_cache

        return getattr(semantic_cache, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
