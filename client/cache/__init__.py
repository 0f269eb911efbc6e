"""The persistent, context-aware semantic cache (public API)."""

from meancache.client.cache.entry import Context, Entry
from meancache.client.cache.errors import (
    CacheAccessError,
    CacheCorruptError,
    CacheError,
    CacheVersionError,
    EntryNotFoundError,
)
from meancache.client.cache.results import CacheStats, Hit, Miss, ThresholdChange
from meancache.client.cache.semantic_cache import CacheSettings, SemanticCache
from meancache.client.cache.source import Source
from meancache.client.cache.store import repair

__all__ = [
    "CacheAccessError", "CacheCorruptError", "CacheError", "CacheSettings", "CacheStats",
    "CacheVersionError", "Context", "Entry", "EntryNotFoundError", "Hit", "Miss",
    "SemanticCache", "Source", "ThresholdChange", "repair",
]
