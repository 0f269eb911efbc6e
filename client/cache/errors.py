"""Errors of the persistent cache. All are MeanCacheError, so the CLI shows their message."""

from meancache.shared.errors import MeanCacheError


class CacheError(MeanCacheError):
    """The cache store cannot be used as it is."""


class CacheAccessError(CacheError):
    """The cache directory cannot be read or written (permissions, not a directory, ...)."""


class CacheCorruptError(CacheError):
    """The cache database is damaged; `meancache cache repair` moves it aside and salvages it."""


class CacheVersionError(CacheError):
    """The cache was written by a newer meancache with a format this one does not know."""


class EntryNotFoundError(CacheError, KeyError):
    """No entry with that id (it may have been evicted or deleted by another process)."""
