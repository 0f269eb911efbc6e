"""Where every token of a schema sits: Prompt Cache's position bookkeeping.

Walking the schema in document order hands out absolute position IDs:
- each module's own tokens form one *segment*, cached as a unit; a nested module is a
  segment of its own, sitting inside its parent's positions;
- the schema's text outside modules (always included) forms the segment ``""``;
- the members of a ``<union>`` all start at the union's first position, and the union
  takes as many positions as its longest member;
- a ``<param len=N>`` reserves N positions for its argument, computed at serving time;
- role tags add the model's chat-template text before and after their content.

Modules are encoded independently, as the paper describes: a segment attends only to
its own earlier tokens and to the schema's leading tokens (the BOS token that the chat
template opens with, segment ``LEADING``), which every prompt shares. That is what
makes a module's states valid whatever else a prompt imports: encoding in schema
context would bake into each module the states of neighbours (other union members,
unimported modules) that a prompt may leave out.
"""

from collections.abc import Iterable
from dataclasses import dataclass, field

from meancache.shared.pml import Module, Param, Role, Schema, Text, Union
from meancache.upstream.prompt_cache.roles import RoleTemplate
from meancache.upstream.prompt_cache.user_text import UserText

LEADING = "<leading>"  # the template's opening tokens (BOS), at position 0
SCHEMA_TEXT = ""  # the segment of a schema's always-included text


@dataclass
class Segment:
    key: str
    token_ids: list[int] = field(default_factory=list)
    positions: list[int] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.token_ids)


@dataclass(frozen=True)
class ParamSlot:
    module: str
    name: str
    start: int
    length: int


@dataclass(frozen=True)
class SchemaLayout:
    schema: Schema
    segments: dict[str, Segment]
    params: dict[tuple[str, str], ParamSlot]
    end: int  # the first position after the schema: a prompt's new text starts here

    @property
    def cached_tokens(self) -> int:
        return sum(len(s) for s in self.segments.values())


class _Walker:
    def __init__(self, user_text: UserText, roles: RoleTemplate) -> None:
        self.user_text = user_text
        self.roles = roles
        self.position = 0
        self.segments: dict[str, Segment] = {
            LEADING: Segment(LEADING), SCHEMA_TEXT: Segment(SCHEMA_TEXT)
        }
        self.params: dict[tuple[str, str], ParamSlot] = {}

    def emit(self, owner: str, text: str, markup: bool = False) -> None:
        """``text``'s tokens: the role tags' ``markup`` may hold special tokens, a
        schema's own text never does."""
        ids = (self.user_text.encode(text) if markup else self.user_text.ids(text)
               ) if text else []
        segment = self.segments[owner]
        segment.token_ids.extend(ids)
        segment.positions.extend(range(self.position, self.position + len(ids)))
        self.position += len(ids)

    def walk(self, nodes: Iterable[object], owner: str) -> None:
        for node in nodes:
            if isinstance(node, Text):
                self.emit(owner, node.text)
            elif isinstance(node, Param):
                self.params[(owner, node.name)] = ParamSlot(owner, node.name, self.position,
                                                            node.length)
                self.position += node.length
            elif isinstance(node, Role):
                self.emit(owner, self.roles.prefix[node.role], markup=True)
                self.walk(node.children, owner)
                self.emit(owner, self.roles.suffix[node.role], markup=True)
            elif isinstance(node, Module):
                self.segments[node.name] = Segment(node.name)
                self.walk(node.children, node.name)
            elif isinstance(node, Union):
                start = end = self.position
                for member in node.members:
                    self.position = start
                    self.walk([member], owner)
                    end = max(end, self.position)
                self.position = end


def lay_out(schema: Schema, user_text: UserText, roles: RoleTemplate) -> SchemaLayout:
    walker = _Walker(user_text, roles)
    if roles.leading:
        walker.emit(LEADING, roles.leading, markup=True)
    walker.walk(schema.children, SCHEMA_TEXT)
    return SchemaLayout(schema, walker.segments, walker.params, walker.position)
