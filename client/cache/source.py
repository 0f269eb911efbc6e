"""Where an answer came from: one enum for cache entries, conversation turns, badges and
exports. A StrEnum whose values are what older caches and conversation files hold, so
those still load and the JSON stays readable."""

from enum import StrEnum


class Source(StrEnum):
    UPSTREAM = "upstream"  # asked the LLM server
    CACHE = "cache"  # served from this device's semantic cache
    PACK = "pack"  # served from a shared cache pack
    USER_CORRECTED = "user-corrected"  # the upstream's answer after the user rejected a hit

    @property
    def from_cache(self) -> bool:
        """Served from a cache, so the user may reject it as wrong."""
        return self in (Source.CACHE, Source.PACK)
