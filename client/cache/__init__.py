"""The persistent, context-aware semantic cache (public API).

SemanticCache is imported on first use (PEP 562): its module pulls in the encoder's torch
layers, which commands that only read the store never need.
"""

from typing import TYPE_CHECKING

from meancache.client.cache.entry import Context, Entry
from meancache.client.cache.repair import repair
from meancache.client.cache.results import CacheStats, Hit, Miss
from meancache.client.cache.settings import CacheSettings
from meancache.client.errors import (
    CacheAccessError,
    CacheCorruptError,
    CacheError,
    CacheVersionError,
    EntryNotFoundError,
)
from meancache.client.matching.feedback import ThresholdChange
from meancache.client.matching.origins import Source

if TYPE_CHECKING:
    from meancache.client.cache.semantic_cache import SemanticCache

__all__ = [
    "CacheAccessError", "CacheCorruptError", "CacheError", "CacheSettings", "CacheStats",
    "CacheVersionError", "Context", "Entry", "EntryNotFoundError", "Hit", "Miss",
    "SemanticCache", "Source", "ThresholdChange", "repair",
]


def __getattr__(name: str) -> object:
    if name == "SemanticCache":
        from meancache.client.cache.semantic_cache import SemanticCache

        return SemanticCache
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
