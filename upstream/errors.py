"""Errors of the upstream server, and the HTTP status each error is answered with::

    UpstreamError                 400 invalid_request_error
    ├── BadRequest                400 invalid_request_error
    ├── InvalidApiKeyError        401 authentication_error   invalid_api_key
    ├── RequestTooLargeError      413 invalid_request_error  request_too_large
    ├── ModelLoadError            400 invalid_request_error
    │   └── UnsupportedModelError 400 invalid_request_error
    ├── PromptTooLongError        400 invalid_request_error  context_length_exceeded
    └── NoPackError               404 invalid_request_error  pack_not_found

PML errors from ``meancache.shared`` are answered too: an unknown schema with 404
``schema_not_found``, any other with 400 ``invalid_pml`` (see :data:`HTTP_ERRORS`).
"""

from dataclasses import dataclass

from meancache.shared.errors import MeanCacheError, PMLError, UnknownSchemaError


class UpstreamError(MeanCacheError):
    """Base of the upstream server's errors."""


class BadRequest(UpstreamError):
    """A request that does not follow the API; answered with 400 and this message."""


class InvalidApiKeyError(UpstreamError):
    """The request carries no API key, or not the one the server was started with."""


class RequestTooLargeError(UpstreamError):
    """The request body is over the server's size limit."""


class ModelLoadError(UpstreamError):
    """The model could not be found or loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture is not one Prompt Cache knows how to lay out."""


class PromptTooLongError(UpstreamError):
    """The prompt and the requested completion do not fit the model's context."""


class NoPackError(UpstreamError):
    """No instruction pack is published (no packs directory, or none in it)."""


@dataclass(frozen=True)
class HTTPErrorKind:
    """How an error is answered: the status and the OpenAI error ``type`` and ``code``."""

    status: int
    type: str
    code: str | None = None


HTTP_ERRORS: dict[type[MeanCacheError], HTTPErrorKind] = {
    UpstreamError: HTTPErrorKind(400, "invalid_request_error"),
    InvalidApiKeyError: HTTPErrorKind(401, "authentication_error", "invalid_api_key"),
    RequestTooLargeError: HTTPErrorKind(413, "invalid_request_error", "request_too_large"),
    PromptTooLongError: HTTPErrorKind(400, "invalid_request_error", "context_length_exceeded"),
    PMLError: HTTPErrorKind(400, "invalid_request_error", "invalid_pml"),
    UnknownSchemaError: HTTPErrorKind(404, "invalid_request_error", "schema_not_found"),
    NoPackError: HTTPErrorKind(404, "invalid_request_error", "pack_not_found"),
}
