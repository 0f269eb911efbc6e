"""The root of meancache's exception tree.

Every error a user can cause or meet derives from :class:`MeanCacheError`, so the
CLI and the app can show its message instead of a traceback.
"""


class MeanCacheError(Exception):
    """Base of every error meancache raises on purpose."""


class InvalidQueryError(MeanCacheError, ValueError):
    """A query that cannot be cached or looked up (empty, not UTF-8, ...)."""


class EncoderError(MeanCacheError):
    """The embedding model could not be loaded or run."""


class ModelNotFoundError(EncoderError):
    """A model was named that is not available locally (nothing is downloaded)."""


class FlowerCommandError(MeanCacheError):
    """A Flower command is missing or failed."""


class RunConfigError(MeanCacheError, ValueError):
    """A federated run's config (Flower run config) lacks a key or holds a bad value."""
