"""Errors of the client side (the cache, settings, chat, FL sync, the upstream client)::

    MeanCacheError (meancache.shared.errors)
    ├── CacheError
    │   ├── CacheAccessError
    │   ├── CacheCorruptError
    │   ├── CacheVersionError
    │   ├── CacheWorkStopped
    │   └── EntryNotFoundError (KeyError)
    ├── ConfigError (meancache.shared.errors)
    ├── SyncError
    ├── DocumentError
    ├── ConversationNotFoundError (KeyError)
    ├── HistoryError
    ├── RejectionError
    ├── UpstreamRequestError
    │   ├── UpstreamUnavailableError
    │   └── UpstreamRejectedError
    ├── StreamTooLong
    ├── ProxyRequestError
    └── PackError (meancache.shared.errors)
        └── PackDownloadError

All are MeanCacheError, so the CLI and the chat show their message, not a traceback.
"""

from meancache.shared.errors import ConfigError as ConfigError  # every side's settings raise it
from meancache.shared.errors import MeanCacheError, PackError


class CacheError(MeanCacheError):
    """The cache store cannot be used as it is."""


class CacheAccessError(CacheError):
    """The cache directory cannot be read or written (permissions, not a directory, ...)."""


class CacheCorruptError(CacheError):
    """The cache database is damaged; `meancache cache repair` moves it aside and salvages it."""


class CacheVersionError(CacheError):
    """The cache was written by a newer meancache with a format this one does not know."""


class CacheWorkStopped(CacheError):
    """A background cache job (re-embedding, a PCA fit) was asked to stop: the cache is
    closing. Raised through the job's progress callback; the next start resumes the work."""


class EntryNotFoundError(CacheError, KeyError):
    """No entry with that id (it may have been evicted or deleted by another process)."""

    __str__ = Exception.__str__  # KeyError's own would quote the message


class SyncError(MeanCacheError):
    """The FL server could not be reached, has no model, or answered something unusable."""


class DocumentError(MeanCacheError):
    """A file that cannot be attached."""


class ConversationNotFoundError(MeanCacheError, KeyError):
    """No conversation with that id."""

    __str__ = Exception.__str__  # KeyError's own would quote the message


class HistoryError(MeanCacheError):
    """A chat cannot be saved, exported or deleted (the disk refused)."""


class RejectionError(MeanCacheError):
    """A "wrong answer" that could not be recorded (the turn cannot be rejected, or the
    chat cannot be saved)."""


class UpstreamRequestError(MeanCacheError):
    """The upstream could not give an answer (the client side; the server's are UpstreamError).

    The message is for the user and the log (it may name the upstream's URL and quote what
    it sent); ``public`` says the same in this program's own words with nothing from the
    upstream but its status: what the proxy tells an app, which need not trust or see it."""

    def __init__(self, message: str, status: int | None = None,
                 public: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.public = public or _own_words(status)


def _own_words(status: int | None) -> str:
    if status is None:
        return "the upstream could not be reached, or its answer broke off"
    if status == 429:
        return "the upstream is busy (it answered 429); try again later"
    if status >= 500:
        return f"the upstream failed (it answered {status})"
    return f"the upstream refused the request (it answered {status})"


class StreamTooLong(MeanCacheError):
    """Raised inside a capped response's byte stream (``upstream_client.cap_stream``): the
    upstream sent more than the answer may hold. Caught by the reader of that stream."""


class UpstreamUnavailableError(UpstreamRequestError):
    """No connection (after the connect retries), a timeout, or a 429 or 5xx (``status``;
    None when there was no answer)."""


class UpstreamRejectedError(UpstreamRequestError):
    """The upstream answered with a 4xx: retrying would not help."""

    status: int

    def __init__(self, message: str, status: int, public: str | None = None) -> None:
        super().__init__(message, status, public)


class ProxyRequestError(MeanCacheError):
    """A request `meancache proxy` refuses: answered with ``status`` and OpenAI's error body
    (``kind`` is its ``type``, ``code`` and ``param`` its fields)."""

    def __init__(self, status: int, message: str, code: str | None = None,
                 param: str | None = None, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.param = param
        self.kind = kind


class PackDownloadError(PackError):
    """A pack download failed or was refused (too large, cut off); the old pack stays."""
