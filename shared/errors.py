"""The root of meancache's exception tree, and the errors of the shared layer.

Every error a user can cause or meet derives from :class:`MeanCacheError`, so the
CLI and the app can show its message instead of a traceback. Each side defines its
errors in one module (``shared`` imports nothing of ours, so the sides extend this tree
and never the other way round)::

    MeanCacheError                        meancache.shared.errors
    ├── InvalidQueryError (ValueError)
    ├── EncoderError
    │   ├── ModelNotFoundError
    │   └── OnnxBackendError
    ├── CheckpointError
    │   └── FreshnessError
    ├── AppSignatureError
    ├── VerifierError
    ├── PairsFileError
    ├── HeadTooLarge (h11.RemoteProtocolError)   (request line or headers past shared.http_limits')
    ├── FlowerCommandError
    ├── MissingExtraError
    ├── RunConfigError (ValueError)
    ├── ConfigError                       (every side's settings: shared.settings)
    ├── PMLError
    │   ├── PMLSyntaxError
    │   ├── UnknownSchemaError (LookupError)
    │   ├── DuplicateSchemaError
    │   ├── UnknownModuleError
    │   ├── UnionConflictError
    │   ├── ArgumentTooLongError
    │   ├── DuplicateImportError
    │   └── MisplacedContentError
    ├── PackError
    │   ├── PackCorruptError
    │   ├── PackVersionError
    │   ├── PackMismatchError
    │   └── PackDownloadError             meancache.client.errors
    ├── CacheError                        meancache.client.errors
    │   ├── CacheAccessError
    │   ├── CacheCorruptError
    │   ├── CacheVersionError
    │   ├── CacheWorkStopped
    │   └── EntryNotFoundError (KeyError)
    ├── SyncError
    ├── DocumentError
    ├── ConversationNotFoundError (KeyError)
    ├── HistoryError
    ├── RejectionError
    ├── UpstreamRequestError
    │   ├── UpstreamUnavailableError
    │   └── UpstreamRejectedError
    ├── StreamTooLong                     (an upstream's body past its byte cap, inside the stream)
    ├── ProxyRequestError                 (`meancache proxy`: status and OpenAI error)
    └── UpstreamError                     meancache.upstream.errors
        ├── BadRequest
        ├── InvalidApiKeyError
        ├── OperatorOnlyError
        ├── RequestTooLargeError
        ├── UnknownModelError
        ├── ModelLoadError
        │   └── UnsupportedModelError
        ├── PromptTooLongError
        ├── UnsupportedMediaTypeError
        ├── HostNotAllowedError
        ├── ServerBusyError
        ├── QuotaExceededError
        ├── ClientGoneError
        └── NoPackError

(fl_server raises the shared errors and defines none of its own.)
"""

from __future__ import annotations

import h11

#: At most this many characters of a caller's text are quoted back in an error message.
EXCERPT_CHARS = 40


def excerpt(text: str, limit: int = EXCERPT_CHARS) -> str:
    """``text`` quoted for an error message, cut to ``limit`` characters: a caller's long
    name or value is never echoed whole."""
    return repr(text) if len(text) <= limit else f"{text[:limit]!r}... ({len(text)} chars)"


class MeanCacheError(Exception):
    """Base of every error meancache raises on purpose."""


class InvalidQueryError(MeanCacheError, ValueError):
    """A query that cannot be cached or looked up (empty, not UTF-8, ...)."""


class EncoderError(MeanCacheError):
    """The embedding model could not be loaded or run."""


class ModelNotFoundError(EncoderError):
    """A model was named that is not available locally (nothing is downloaded)."""


class VerifierError(MeanCacheError):
    """The learned verifier cannot be loaded or trained (a missing or altered model file,
    unusable training data)."""


class MissingExtraError(MeanCacheError):
    """An optional package is needed that this install left out (an extra names it)."""


class OnnxBackendError(EncoderError):
    """ONNX export, loading or the parity check failed; the encoder falls back to PyTorch."""


class CheckpointError(MeanCacheError):
    """A checkpoint that is missing, damaged or does not match its hash."""


class FreshnessError(CheckpointError):
    """A signed model a device refuses as stale: expired, older than what it has, or
    without signed freshness (shared.fl.freshness)."""


class AppSignatureError(MeanCacheError):
    """An operator's app key or app signature that cannot be read or does not fit."""


class PairsFileError(MeanCacheError):
    """A labelled-pairs file that cannot be read, with the line that is wrong."""


class FlowerCommandError(MeanCacheError):
    """A Flower command is missing or failed."""


class ConfigError(MeanCacheError):
    """A setting has an unknown name or a value of the wrong kind (it names the key and
    where the value came from: config.toml, an environment variable or a flag)."""


class RunConfigError(MeanCacheError, ValueError):
    """A federated run's config (Flower run config) lacks a key or holds a bad value."""


class PMLError(MeanCacheError):
    """Base of every PML error: ``line`` and ``column`` are 1-based.

    They are None only when no source exists to point into (a registry lookup by a bare
    name); the message then carries no location.
    """

    def __init__(self, reason: str, line: int | None = None, column: int | None = None) -> None:
        self.reason = reason
        self.line = line
        self.column = column
        where = f"line {line}, column {column}: " if line is not None else ""
        super().__init__(f"{where}{reason}")

    def __reduce__(self) -> tuple[type[PMLError], tuple[str, int | None, int | None]]:
        # The default would re-create the error from the formatted message alone.
        return (type(self), (self.reason, self.line, self.column))


class PMLSyntaxError(PMLError):
    """Malformed markup, an unknown tag, a missing or invalid attribute, a bad module name."""


class UnknownSchemaError(PMLError, LookupError):
    """A prompt names a schema that is not the one given (or not registered)."""


class DuplicateSchemaError(PMLError):
    """A schema is added to a registry that already holds one by that name."""


class UnknownModuleError(PMLError):
    """An import of a module or parameter the schema lacks, or under the wrong parent."""


class UnionConflictError(PMLError):
    """A prompt imports two members of one union."""


class ArgumentTooLongError(PMLError):
    """An argument has more tokens than its parameter reserves."""


class DuplicateImportError(PMLError):
    """A prompt imports the same module twice."""


class MisplacedContentError(PMLError):
    """Well-formed content in a place PML does not allow it."""


class PackError(MeanCacheError):
    """An instruction pack that cannot be used; the pack in use (if any) stays in use."""


class PackCorruptError(PackError):
    """Not a pack, or a pack cut short or altered (its sha256 does not match)."""


class PackVersionError(PackError):
    """A pack in a format version this meancache does not read."""


class PackMismatchError(PackError):
    """A pack built for another model, or embedded by another encoder."""


class HeadTooLarge(MeanCacheError, h11.RemoteProtocolError):
    """A request line or headers past ``shared.http_limits``' limits: ``status`` and
    ``message`` are the answer (an h11 protocol error, so the server's parser stops)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message, error_status_hint=status)
        self.status = status
        self.message = message
