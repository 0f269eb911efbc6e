"""Errors of the upstream server; the HTTP layer maps each to a 4xx with its message."""

from meancache.shared.errors import MeanCacheError


class UpstreamError(MeanCacheError):
    """Base of the upstream server's errors."""


class ModelLoadError(UpstreamError):
    """The model could not be found or loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture is not one Prompt Cache knows how to lay out."""


class PromptTooLongError(UpstreamError):
    """The prompt and the requested completion do not fit the model's context."""
