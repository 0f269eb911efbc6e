"""Errors for PML schemas and prompts; each one points at a line and column of its source."""

from __future__ import annotations

from meancache.shared.errors import MeanCacheError


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
