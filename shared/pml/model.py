"""The PML data model: immutable trees for schemas and prompts, with source positions.

Every parsed node records where it starts in its source (1-based line and column), so
that the validator can point at the offending tag and the server can report its own
layout problems in the user's terms; a node built in code is UNPLACED.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal, TypeAlias

RoleName: TypeAlias = Literal["system", "user", "assistant"]
ROLE_NAMES: tuple[RoleName, ...] = ("system", "user", "assistant")


@dataclass(frozen=True, order=True)
class Position:
    """Where a tag or a run of text starts: 1-based line, 1-based column (in characters)."""

    line: int
    column: int

    def __str__(self) -> str:
        return f"line {self.line}, column {self.column}"


#: The position of a node built in code rather than parsed (see shared.pml.writer).
UNPLACED = Position(0, 0)


@dataclass(frozen=True)
class Text:
    """Literal text, entities and CDATA already resolved."""

    text: str
    pos: Position = UNPLACED


@dataclass(frozen=True)
class Param:
    """A slot of at most ``length`` tokens inside a module, filled by a prompt argument."""

    name: str
    length: int
    pos: Position = UNPLACED


@dataclass(frozen=True)
class Role:
    """Content the server wraps in the model's chat template for ``role``."""

    role: RoleName
    children: tuple[Node, ...]
    pos: Position = UNPLACED


@dataclass(frozen=True)
class Module:
    """A named, separately cacheable span of a schema; modules may nest."""

    name: str
    children: tuple[Node, ...]
    pos: Position = UNPLACED

    def params(self) -> dict[str, Param]:
        """This module's own parameters by name (those of nested modules excluded)."""
        found: dict[str, Param] = {}
        stack: list[Node] = list(reversed(self.children))
        while stack:
            node = stack.pop()
            if isinstance(node, Param):
                found[node.name] = node
            elif isinstance(node, Role):
                stack.extend(reversed(node.children))
        return found


@dataclass(frozen=True)
class Union:
    """Mutually exclusive modules: a prompt imports at most one member."""

    members: tuple[Module, ...]
    pos: Position = UNPLACED

    def names(self) -> tuple[str, ...]:
        return tuple(member.name for member in self.members)


Node: TypeAlias = Text | Param | Role | Module | Union


@dataclass(frozen=True)
class _SchemaIndex:
    modules: dict[str, Module]
    parents: dict[str, str | None]
    unions: dict[str, Union]


@dataclass(frozen=True)
class Schema:
    """A parsed ``<schema>``; module names are unique within it (the parser enforces it)."""

    name: str
    children: tuple[Node, ...]
    pos: Position = UNPLACED

    @cached_property
    def _index(self) -> _SchemaIndex:
        # Built once on first use; cached_property writes __dict__ directly, so it works
        # on a frozen dataclass and stays out of eq/hash.
        modules: dict[str, Module] = {}
        parents: dict[str, str | None] = {}
        unions: dict[str, Union] = {}

        def walk(nodes: tuple[Node, ...], parent: str | None) -> None:
            for node in nodes:
                if isinstance(node, Module):
                    modules[node.name] = node
                    parents[node.name] = parent
                    walk(node.children, node.name)
                elif isinstance(node, Role):
                    walk(node.children, parent)
                elif isinstance(node, Union):
                    for member in node.members:
                        unions[member.name] = node
                    walk(node.members, parent)

        walk(self.children, None)
        return _SchemaIndex(modules, parents, unions)

    def modules(self) -> dict[str, Module]:
        """Every module, nested ones included, by name, in document order."""
        return dict(self._index.modules)

    def module(self, name: str) -> Module | None:
        """The module called ``name``, or None."""
        return self._index.modules.get(name)

    def parent_of(self, name: str) -> str | None:
        """The name of the nearest module enclosing ``name``; None at top level or if unknown."""
        return self._index.parents.get(name)

    def union_of(self, name: str) -> Union | None:
        """The union ``name`` is a member of, if any."""
        return self._index.unions.get(name)


@dataclass(frozen=True)
class Import:
    """A module imported by a prompt, with its arguments and nested imports."""

    name: str
    args: dict[str, str] = field(hash=False)
    children: tuple[Import, ...]
    pos: Position = UNPLACED


PromptNode: TypeAlias = Import | Text | Role


@dataclass(frozen=True)
class Prompt:
    """A parsed ``<prompt>``; its roles hold Text only."""

    schema: str
    children: tuple[PromptNode, ...]
    pos: Position = UNPLACED

    def imports(self) -> tuple[Import, ...]:
        """The top-level imports in order (nested ones are in each import's children)."""
        return tuple(child for child in self.children if isinstance(child, Import))
