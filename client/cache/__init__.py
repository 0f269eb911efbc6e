"""The persistent, context-aware semantic cache (public API)."""

from client.cache.entry import Context, Entry, Source
from client.cache.errors import (
    CacheAccessError,
    CacheCorruptError,
    CacheError,
    CacheVersionError,
    EntryNotFoundError,
)
from client.cache.results import CacheStats, Hit, Miss, ThresholdChange
from client.cache.semantic_cache import CacheSettings, SemanticCache
from client.cache.store import repair

__all__ = [
    "CacheAccessError", "CacheCorruptError", "CacheError", "CacheSettings", "CacheStats",
    "CacheVersionError", "Context", "Entry", "EntryNotFoundError", "Hit", "Miss",
    "SemanticCache", "Source", "ThresholdChange", "repair",
]
