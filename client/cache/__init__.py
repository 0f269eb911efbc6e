"""The persistent, context-aware semantic cache (public API)."""

from meancache.client.cache.entry import Context, Entry, Source
from meancache.client.cache.results import CacheStats, Hit, Miss, ThresholdChange
from meancache.client.cache.semantic_cache import CacheSettings, SemanticCache
from meancache.client.cache.store import repair
from meancache.client.errors import (
    CacheAccessError,
    CacheCorruptError,
    CacheError,
    CacheVersionError,
    EntryNotFoundError,
)

__all__ = [
    "CacheAccessError", "CacheCorruptError", "CacheError", "CacheSettings", "CacheStats",
    "CacheVersionError", "Context", "Entry", "EntryNotFoundError", "Hit", "Miss",
    "SemanticCache", "Source", "ThresholdChange", "repair",
]
