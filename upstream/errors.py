"""Errors of the upstream server, and the HTTP status each error is answered with::

    UpstreamError                 400 invalid_request_error
    ├── BadRequest                400 invalid_request_error
    ├── InvalidApiKeyError        401 authentication_error   invalid_api_key
    ├── OperatorOnlyError         403 permission_error       operator_only
    ├── RequestTooLargeError      413 invalid_request_error  request_too_large
    ├── UnknownModelError         404 invalid_request_error  model_not_found
    ├── ModelLoadError            400 invalid_request_error
    │   └── UnsupportedModelError 400 invalid_request_error
    ├── PromptTooLongError        400 invalid_request_error  context_length_exceeded
    ├── UnsupportedMediaTypeError 415 invalid_request_error  unsupported_media_type
    ├── HostNotAllowedError       400 invalid_request_error  host_not_allowed
    ├── ServerBusyError           429 rate_limit_error       server_busy
    ├── QuotaExceededError        429 rate_limit_error       quota_exceeded
    ├── ClientGoneError           499 invalid_request_error  client_closed_request
    └── NoPackError               404 invalid_request_error  pack_not_found

PML errors from ``meancache.shared`` are answered too: an unknown schema with 404
``schema_not_found``, any other with 400 ``invalid_pml`` (see :data:`HTTP_ERRORS`).
"""

from dataclasses import dataclass

from meancache.shared.errors import MeanCacheError, PMLError, UnknownSchemaError


class UpstreamError(MeanCacheError):
    """Base of the upstream server's errors; ``param`` names the request field at fault
    (OpenAI's error body carries it)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class BadRequest(UpstreamError):
    """A request that does not follow the API; answered with 400 and this message."""


class InvalidApiKeyError(UpstreamError):
    """The request carries no API key, or not the one the server was started with."""


class OperatorOnlyError(UpstreamError):
    """A tenant's key asked for what only the operator's key may see (the server-wide
    metrics, which count every tenant's traffic)."""


class RequestTooLargeError(UpstreamError):
    """The request body is over the server's size limit."""


class UnknownModelError(UpstreamError):
    """The request names a model this server does not serve."""


class ModelLoadError(UpstreamError):
    """The model could not be found or loaded."""


class UnsupportedModelError(ModelLoadError):
    """The model's architecture is not one Prompt Cache knows how to lay out."""


class PromptTooLongError(UpstreamError):
    """The prompt and the requested completion do not fit the model's context."""


class UnsupportedMediaTypeError(UpstreamError):
    """A body sent with a Content-Type the route does not read (a web page's form post)."""


class HostNotAllowedError(UpstreamError):
    """A Host header outside the server's names: a DNS-rebinding page, or a wrong URL."""


class ServerBusyError(UpstreamError):
    """The model's request queue is full; the client should retry later."""


class QuotaExceededError(UpstreamError):
    """One API key asked for more schemas or schema tokens than the server allows a key."""


class ClientGoneError(UpstreamError):
    """The client closed the connection before its request was read: nobody hears the
    answer, and it is counted apart from server failures (nginx's 499)."""


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
    OperatorOnlyError: HTTPErrorKind(403, "permission_error", "operator_only"),
    RequestTooLargeError: HTTPErrorKind(413, "invalid_request_error", "request_too_large"),
    UnknownModelError: HTTPErrorKind(404, "invalid_request_error", "model_not_found"),
    PromptTooLongError: HTTPErrorKind(400, "invalid_request_error", "context_length_exceeded"),
    UnsupportedMediaTypeError: HTTPErrorKind(415, "invalid_request_error",
                                             "unsupported_media_type"),
    HostNotAllowedError: HTTPErrorKind(400, "invalid_request_error", "host_not_allowed"),
    ServerBusyError: HTTPErrorKind(429, "rate_limit_error", "server_busy"),
    QuotaExceededError: HTTPErrorKind(429, "rate_limit_error", "quota_exceeded"),
    ClientGoneError: HTTPErrorKind(499, "invalid_request_error", "client_closed_request"),
    PMLError: HTTPErrorKind(400, "invalid_request_error", "invalid_pml"),
    UnknownSchemaError: HTTPErrorKind(404, "invalid_request_error", "schema_not_found"),
    NoPackError: HTTPErrorKind(404, "invalid_request_error", "pack_not_found"),
}
