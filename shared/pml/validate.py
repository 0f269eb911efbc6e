"""Check a parsed prompt against its schema before the server lays it out.

Imports are checked in document order, so the error raised is the first one a reader
would meet. Parameters a prompt leaves without an argument are fine: the server leaves
their reserved positions empty.
"""

from __future__ import annotations

from collections.abc import Callable

from meancache.shared.errors import (
    ArgumentTooLongError,
    DuplicateImportError,
    UnionConflictError,
    UnknownModuleError,
    UnknownSchemaError,
)
from meancache.shared.pml.model import Import, Prompt, Schema

TokenCounter = Callable[[str], int]


def validate_prompt(
    prompt: Prompt, schema: Schema, count_tokens: TokenCounter | None = None
) -> None:
    """Raise a PMLError subclass if ``prompt`` does not fit ``schema``.

    With ``count_tokens`` each argument is also checked against its parameter's ``len``;
    without it only the argument names are checked.
    """
    if prompt.schema != schema.name:
        raise UnknownSchemaError(
            f"prompt uses schema '{prompt.schema}', but the schema given is '{schema.name}'; "
            "name the schema the prompt was written for",
            prompt.pos.line,
            prompt.pos.column,
        )
    _Checker(schema, count_tokens).check(prompt.imports(), parent=None)


class _Checker:
    def __init__(self, schema: Schema, count_tokens: TokenCounter | None) -> None:
        self.schema = schema
        self.count_tokens = count_tokens
        self.seen: dict[str, Import] = {}
        self.union_picks: dict[tuple[str, ...], Import] = {}

    def check(self, imports: tuple[Import, ...], parent: str | None) -> None:
        for imp in imports:
            self._check_one(imp, parent)
            self.check(imp.children, parent=imp.name)

    def _check_one(self, imp: Import, parent: str | None) -> None:
        line, column = imp.pos.line, imp.pos.column
        module = self.schema.module(imp.name)
        if module is None:
            raise UnknownModuleError(
                f"unknown module '{imp.name}' in schema '{self.schema.name}'", line, column
            )
        actual_parent = self.schema.parent_of(imp.name)
        if actual_parent != parent:
            where = (
                "at the top level of the prompt"
                if actual_parent is None
                else f"inside <{actual_parent}>"
            )
            found = "at the top level" if parent is None else f"inside <{parent}>"
            raise UnknownModuleError(
                f"module '{imp.name}' is imported {found}, but it must be imported {where}",
                line,
                column,
            )
        if imp.name in self.seen:
            first = self.seen[imp.name].pos
            raise DuplicateImportError(
                f"module '{imp.name}' is imported twice (first at {first}); remove one",
                line, column,
            )
        self.seen[imp.name] = imp
        union = self.schema.union_of(imp.name)
        if union is not None:
            key = union.names()
            other = self.union_picks.get(key)
            if other is not None:
                raise UnionConflictError(
                    f"modules '{other.name}' (at {other.pos}) and '{imp.name}' belong to one "
                    "union and exclude each other; import only one of them",
                    line,
                    column,
                )
            self.union_picks[key] = imp
        params = module.params()
        for arg, value in imp.args.items():
            param = params.get(arg)
            if param is None:
                known = ", ".join(params) or "none"
                raise UnknownModuleError(
                    f"unknown parameter '{arg}' for module '{imp.name}' (its parameters: {known})",
                    line,
                    column,
                )
            if self.count_tokens is not None:
                tokens = self.count_tokens(value)
                if tokens > param.length:
                    raise ArgumentTooLongError(
                        f"argument '{arg}' of module '{imp.name}' is {tokens} tokens long, "
                        f"but the parameter allows at most {param.length}; shorten it",
                        line,
                        column,
                    )
