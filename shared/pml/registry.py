"""A name-to-schema store for the server, so prompts can be resolved by their schema name."""

from __future__ import annotations

import threading
from collections.abc import Iterator

from meancache.shared.errors import DuplicateSchemaError, UnknownSchemaError, excerpt
from meancache.shared.pml.model import Position, Prompt, Schema
from meancache.shared.pml.parser import parse_schema
from meancache.shared.pml.validate import TokenCounter, validate_prompt


class SchemaRegistry:
    """Schemas by name. Safe to share between threads.

    Adding a name twice is an error unless ``replace=True``: caches built for the old
    schema would silently go stale otherwise.
    """

    def __init__(self) -> None:
        self._schemas: dict[str, Schema] = {}
        self._lock = threading.Lock()

    def add(self, schema: Schema, *, replace: bool = False) -> Schema:
        with self._lock:
            if not replace and schema.name in self._schemas:
                raise DuplicateSchemaError(
                    f"schema '{schema.name}' is already registered; remove it first or give "
                    "the new one another name",
                    schema.pos.line,
                    schema.pos.column,
                )
            self._schemas[schema.name] = schema
        return schema

    def add_source(self, source: str, *, replace: bool = False) -> Schema:
        """Parse a ``<schema>`` document and add it."""
        return self.add(parse_schema(source), replace=replace)

    def get(self, name: str, pos: Position | None = None) -> Schema:
        """The schema called ``name``; ``pos`` (the prompt's) locates the error if missing."""
        with self._lock:
            schema = self._schemas.get(name)
        if schema is None:
            raise UnknownSchemaError(
                f"unknown schema {excerpt(name)}; register it first",
                pos.line if pos else None,
                pos.column if pos else None,
            )
        return schema

    def remove(self, name: str) -> Schema:
        """Drop the schema called ``name`` and return it."""
        with self._lock:
            schema = self._schemas.pop(name, None)
        if schema is None:
            raise UnknownSchemaError(f"unknown schema {excerpt(name)}; it was never registered "
                                     "or is already removed")
        return schema

    def list(self) -> list[str]:
        """Registered schema names, sorted."""
        with self._lock:
            return sorted(self._schemas)

    def resolve(self, prompt: Prompt, count_tokens: TokenCounter | None = None) -> Schema:
        """The schema ``prompt`` names, after validating the prompt against it."""
        schema = self.get(prompt.schema, prompt.pos)
        validate_prompt(prompt, schema, count_tokens)
        return schema

    def __getitem__(self, name: str) -> Schema:
        return self.get(name)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._schemas

    def __len__(self) -> int:
        with self._lock:
            return len(self._schemas)

    def __iter__(self) -> Iterator[str]:
        return iter(self.list())
