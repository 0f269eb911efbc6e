"""Parse PML schemas and prompts into the model, with positions from expat.

Parsing runs in two passes: expat builds a plain element tree (so any malformed markup
is reported first, at expat's own position), then the tree is checked against the PML
grammar and turned into model nodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import cast
from xml.parsers import expat

from meancache.shared.errors import MisplacedContentError, PMLError, PMLSyntaxError, excerpt
from meancache.shared.pml.model import (
    ROLE_NAMES,
    Import,
    Module,
    Node,
    Param,
    Position,
    Prompt,
    PromptNode,
    Role,
    RoleName,
    Schema,
    Text,
    Union,
)

#: Tag names with a meaning of their own; modules may not take them as names.
RESERVED_NAMES = frozenset({"schema", "module", "param", "union", "prompt", *ROLE_NAMES})

#: How deeply tags may nest in one document.
MAX_DEPTH = 100
#: A parameter's ``len`` has at most this many digits (no context comes near 10^9).
MAX_LEN_DIGITS = 9

#: Schema, module and parameter names have at most this many characters.
MAX_NAME_CHARS = 64
#: What one schema may hold: every module is encoded (a forward pass) when it is added.
MAX_MODULES = 64
MAX_UNION_MEMBERS = 32
#: Modules nested inside modules, counting the outermost as 1.
MAX_MODULE_DEPTH = 4

# Module, parameter and schema names become tag and attribute names in prompts, so they
# must be XML names (without ':' so that namespaces never get involved).
_NAME = re.compile(r"[^\W\d][\w.-]*")


# --- pass 1: expat to a plain element tree ------------------------------------------


@dataclass
class _Chars:
    """A maximal run of character data between two tags."""

    text: str
    pos: Position
    cdata: bool

    def is_blank(self) -> bool:
        """Whitespace-only runs are dropped, unless written as CDATA on purpose."""
        return not self.cdata and not self.text.strip()


@dataclass
class _Element:
    tag: str
    attrs: dict[str, str]
    pos: Position
    children: list[_Element | _Chars] = field(default_factory=list)


class _TreeBuilder:
    """Collect expat events into an element tree; character runs merge across entities,
    CDATA sections and comments."""

    def __init__(self) -> None:
        self.parser = expat.ParserCreate()
        self.root: _Element | None = None
        self.stack: list[_Element] = []
        self._chunks: list[str] = []
        self._chunks_pos: Position | None = None
        self._chunks_cdata = False
        p = self.parser
        p.StartElementHandler = self._start
        p.EndElementHandler = self._end
        p.CharacterDataHandler = self._chars
        p.StartCdataSectionHandler = self._cdata
        p.StartDoctypeDeclHandler = self._doctype

    def _here(self) -> Position:
        return Position(self.parser.CurrentLineNumber, self.parser.CurrentColumnNumber + 1)

    def _flush(self) -> None:
        if self._chunks and self._chunks_pos is not None and self.stack:
            run = _Chars("".join(self._chunks), self._chunks_pos, self._chunks_cdata)
            self.stack[-1].children.append(run)
        self._chunks = []
        self._chunks_pos = None
        self._chunks_cdata = False

    def _start(self, tag: str, attrs: dict[str, str]) -> None:
        self._flush()
        element = _Element(tag, attrs, self._here())
        if len(self.stack) >= MAX_DEPTH:
            # Later passes recurse per level; a hostile prompt must not reach Python's limit.
            raise _syntax(f"tags nested more than {MAX_DEPTH} deep", element.pos)
        if self.stack:
            self.stack[-1].children.append(element)
        else:
            self.root = element
        self.stack.append(element)

    def _end(self, tag: str) -> None:
        self._flush()
        self.stack.pop()

    def _chars(self, data: str) -> None:
        if self._chunks_pos is None:
            self._chunks_pos = self._here()
        self._chunks.append(data)

    def _cdata(self) -> None:
        if self._chunks_pos is None:
            self._chunks_pos = self._here()
        self._chunks_cdata = True

    def _doctype(self, *_: object) -> None:
        # A DTD could declare entities (and entity bombs); PML has no use for one.
        pos = self._here()
        raise PMLSyntaxError("a DOCTYPE declaration is not allowed in PML; remove it",
                             pos.line, pos.column)

    def build(self, source: str) -> _Element:
        try:
            self.parser.Parse(source, True)
        except expat.ExpatError as exc:
            raise self._translate(exc) from None
        except UnicodeEncodeError as exc:  # a lone surrogate: no UTF-8 spells it
            line = source.count("\n", 0, exc.start) + 1
            column = exc.start - (source.rfind("\n", 0, exc.start) + 1) + 1
            raise PMLSyntaxError(f"character {source[exc.start]!r} is not valid Unicode text "
                                 "(a lone surrogate); remove it", line, column) from None
        assert self.root is not None  # expat fails on a document without an element
        return self.root

    def _translate(self, exc: expat.ExpatError) -> PMLError:
        line, column = exc.lineno, exc.offset + 1
        codes = expat.errors.codes
        code = exc.code
        if code == codes[expat.errors.XML_ERROR_JUNK_AFTER_DOC_ELEMENT]:
            root = self.root.tag if self.root is not None else "root"
            return MisplacedContentError(
                f"content after the root element <{root}> (a document has exactly one root)",
                line,
                column,
            )
        reason = expat.ErrorString(code)
        open_tag = self.stack[-1] if self.stack else None
        if code == codes[expat.errors.XML_ERROR_TAG_MISMATCH] and open_tag is not None:
            # expat points at the name in the end tag; point at its '</' instead.
            column = max(1, column - 2)
            reason = (
                f"mismatched tag: expected </{open_tag.tag}> to close <{open_tag.tag}> "
                f"opened at {open_tag.pos}"
            )
        elif code == codes[expat.errors.XML_ERROR_NO_ELEMENTS] and open_tag is not None:
            # Point at the tag left open, not at the end of the document.
            return PMLSyntaxError(
                f"malformed markup: unclosed tag <{open_tag.tag}> (the document ends at "
                f"line {line}, column {column})",
                open_tag.pos.line,
                open_tag.pos.column,
            )
        elif code == codes[expat.errors.XML_ERROR_NO_ELEMENTS]:
            reason = "no element found (the document is empty)"
        elif code in (
            codes[expat.errors.XML_ERROR_INVALID_TOKEN],
            codes[expat.errors.XML_ERROR_UNDEFINED_ENTITY],
        ):
            reason += "; write &lt; and &amp; (or a <![CDATA[...]]> section) for literal < and &"
        return PMLSyntaxError(f"malformed markup: {reason}", line, column)


def _build(source: str) -> _Element:
    return _TreeBuilder().build(source)


# --- shared checks -------------------------------------------------------------------


def _syntax(reason: str, pos: Position) -> PMLSyntaxError:
    return PMLSyntaxError(reason, pos.line, pos.column)


def _misplaced(reason: str, pos: Position) -> MisplacedContentError:
    return MisplacedContentError(reason, pos.line, pos.column)


def _attrs(el: _Element, required: tuple[str, ...]) -> None:
    """Reject missing attributes, and unknown ones (a typo would otherwise pass silently)."""
    for name in el.attrs:
        if name not in required:
            raise _syntax(f"unexpected attribute '{name}' on <{el.tag}>", el.pos)
    for name in required:
        if name not in el.attrs:
            raise _syntax(f"<{el.tag}> is missing the '{name}' attribute", el.pos)


def _name(el: _Element, attr: str) -> str:
    value = el.attrs[attr]
    _check_length(value, f"{attr} on <{_short(el.tag)}>", el.pos)
    if not _NAME.fullmatch(value):
        raise _syntax(
            f"invalid {attr} {excerpt(value)} on <{el.tag}>: it must start with a letter or "
            "'_' and hold only letters, digits, '_', '-' and '.'",
            el.pos,
        )
    return value


def _check_length(name: str, what: str, pos: Position) -> None:
    if len(name) > MAX_NAME_CHARS:
        raise _syntax(f"the {what} {excerpt(name)} is too long: names have at most "
                      f"{MAX_NAME_CHARS} characters", pos)


def _short(tag: str) -> str:
    return tag if len(tag) <= MAX_NAME_CHARS else tag[:MAX_NAME_CHARS] + "..."


# --- pass 2a: schemas ------------------------------------------------------------------


class _SchemaReader:
    """Turn a schema's element tree into model nodes, enforcing the schema grammar."""

    def __init__(self) -> None:
        self.modules: dict[str, Position] = {}
        self.params: dict[str, dict[str, Position]] = {}
        self.depth = 0  # modules open around the one being read

    def read(self, root: _Element) -> Schema:
        if root.tag != "schema":
            raise _syntax(f"expected <schema> as the root element, found <{root.tag}>", root.pos)
        _attrs(root, ("name",))
        name = _name(root, "name")
        return Schema(name, self._children(root, module=None, in_role=False), root.pos)

    def _children(self, el: _Element, module: str | None, in_role: bool) -> tuple[Node, ...]:
        nodes: list[Node] = []
        for child in el.children:
            if isinstance(child, _Chars):
                if not child.is_blank():
                    nodes.append(Text(child.text, child.pos))
            else:
                nodes.append(self._node(child, module, in_role))
        return tuple(nodes)

    def _node(self, el: _Element, module: str | None, in_role: bool) -> Node:
        if el.tag == "module":
            return self._module(el, in_role)
        if el.tag == "param":
            return self._param(el, module)
        if el.tag == "union":
            return self._union(el, module, in_role)
        if el.tag in ROLE_NAMES:
            if in_role:
                raise _misplaced(f"role tag <{el.tag}> nested inside another role tag", el.pos)
            _attrs(el, ())
            role = cast(RoleName, el.tag)
            return Role(role, self._children(el, module, in_role=True), el.pos)
        if el.tag in ("schema", "prompt"):
            raise _syntax(f"<{el.tag}> is only allowed as the root element", el.pos)
        raise _syntax(
            f"unknown tag <{el.tag}> in a schema (expected <module>, <param>, <union>, "
            "<system>, <user> or <assistant>)",
            el.pos,
        )

    def _module(self, el: _Element, in_role: bool) -> Module:
        _attrs(el, ("name",))
        name = _name(el, "name")
        if name in RESERVED_NAMES:
            raise _syntax(f"module name '{name}' clashes with the reserved tag <{name}>", el.pos)
        if name in self.modules:
            raise _syntax(
                f"duplicate module name '{name}' (first defined at {self.modules[name]})", el.pos
            )
        if len(self.modules) >= MAX_MODULES:
            raise _syntax(f"a schema holds at most {MAX_MODULES} modules; split it into "
                          "several schemas", el.pos)
        if self.depth >= MAX_MODULE_DEPTH:
            raise _syntax(f"modules nested more than {MAX_MODULE_DEPTH} deep", el.pos)
        self.modules[name] = el.pos
        self.params[name] = {}
        self.depth += 1
        children = self._children(el, module=name, in_role=in_role)
        self.depth -= 1
        return Module(name, children, el.pos)

    def _param(self, el: _Element, module: str | None) -> Param:
        if module is None:
            raise _misplaced("<param> outside a module (parameters belong to modules)", el.pos)
        _attrs(el, ("name", "len"))
        name = _name(el, "name")
        raw = el.attrs["len"]
        # a bound on digits first: int() of thousands of digits is slow, then refused
        if not (raw.isascii() and raw.isdigit() and len(raw) <= MAX_LEN_DIGITS
                and int(raw) > 0):
            raise _syntax(
                f"invalid len '{raw[:20]}' on <param name=\"{name}\">: expected a positive "
                f"integer of at most {MAX_LEN_DIGITS} digits",
                el.pos,
            )
        for child in el.children:
            if not (isinstance(child, _Chars) and child.is_blank()):
                raise _syntax(f'<param name="{name}"> must be empty', el.pos)
        seen = self.params[module]
        if name in seen:
            raise _syntax(
                f"duplicate parameter '{name}' in module '{module}' (first defined at "
                f"{seen[name]})",
                el.pos,
            )
        seen[name] = el.pos
        return Param(name, int(raw), el.pos)

    def _union(self, el: _Element, module: str | None, in_role: bool) -> Union:
        _attrs(el, ())
        members: list[Module] = []
        for child in el.children:
            if isinstance(child, _Chars):
                if not child.is_blank():
                    raise _misplaced(
                        "text directly inside <union> (it holds only modules)", child.pos
                    )
            elif child.tag == "module":
                if len(members) >= MAX_UNION_MEMBERS:
                    raise _syntax(f"a <union> holds at most {MAX_UNION_MEMBERS} modules",
                                  child.pos)
                members.append(self._module(child, in_role))
            elif child.tag == "union":
                raise _misplaced("<union> inside another <union>", child.pos)
            elif child.tag == "param" or child.tag in ROLE_NAMES:
                raise _misplaced(
                    f"<{child.tag}> directly inside <union> (it holds only modules)", child.pos
                )
            else:
                self._node(child, module, in_role)  # raises the right error for the tag
        if not members:
            raise _syntax("empty <union> (it needs at least one <module>)", el.pos)
        return Union(tuple(members), el.pos)


def parse_schema(source: str) -> Schema:
    """Parse a ``<schema>`` document; raise a PMLError subclass on anything invalid."""
    return _SchemaReader().read(_build(source))


# --- pass 2b: prompts ------------------------------------------------------------------

_SCHEMA_ONLY_TAGS = ("schema", "module", "param", "union", "prompt")


def _prompt_tag_check(el: _Element) -> None:
    if el.tag in _SCHEMA_ONLY_TAGS:
        raise _syntax(
            f"<{el.tag}> is not allowed inside a prompt (import modules by name, "
            "e.g. <city-info/>)",
            el.pos,
        )


def _prompt_role(el: _Element) -> Role:
    _attrs(el, ())
    texts: list[Text] = []
    for child in el.children:
        if isinstance(child, _Chars):
            if not child.is_blank():
                texts.append(Text(child.text, child.pos))
            continue
        _prompt_tag_check(child)
        if child.tag in ROLE_NAMES:
            raise _misplaced(f"role tag <{child.tag}> nested inside <{el.tag}>", child.pos)
        raise _misplaced(
            f"module import <{child.tag}> inside role tag <{el.tag}> (a role in a prompt holds "
            "text only)",
            child.pos,
        )
    return Role(cast(RoleName, el.tag), tuple(texts), el.pos)


def _import(el: _Element) -> Import:
    _check_length(el.tag, "imported module", el.pos)
    for arg in el.attrs:
        _check_length(arg, f"argument of <{el.tag}>", el.pos)
    children: list[Import] = []
    for child in el.children:
        if isinstance(child, _Chars):
            if not child.is_blank():
                raise _misplaced(
                    f"text inside import <{el.tag}> (write new text between or after imports)",
                    child.pos,
                )
            continue
        _prompt_tag_check(child)
        if child.tag in ROLE_NAMES:
            raise _misplaced(f"role tag <{child.tag}> inside import <{el.tag}>", child.pos)
        children.append(_import(child))
    return Import(el.tag, dict(el.attrs), tuple(children), el.pos)


def parse_prompt(source: str) -> Prompt:
    """Parse a ``<prompt>`` document; raise a PMLError subclass on anything invalid.

    Imports are not checked against a schema here; see :func:`validate_prompt`.
    """
    root = _build(source)
    if root.tag != "prompt":
        raise _syntax(f"expected <prompt> as the root element, found <{root.tag}>", root.pos)
    _attrs(root, ("schema",))
    if not root.attrs["schema"].strip():
        raise _syntax("empty schema attribute on <prompt>", root.pos)
    _check_length(root.attrs["schema"], "schema", root.pos)
    nodes: list[PromptNode] = []
    for child in root.children:
        if isinstance(child, _Chars):
            if not child.is_blank():
                nodes.append(Text(child.text, child.pos))
            continue
        _prompt_tag_check(child)
        nodes.append(_prompt_role(child) if child.tag in ROLE_NAMES else _import(child))
    return Prompt(root.attrs["schema"], tuple(nodes), root.pos)


def is_prompt(text: str) -> bool:
    """Whether ``text`` looks like a PML prompt: its first non-space characters open <prompt>.

    A cheap test for routing user input; it does not parse or validate anything.
    """
    body = text.lstrip()
    if not body.startswith("<prompt"):
        return False
    rest = body[len("<prompt") :]
    return rest == "" or rest[0] in " \t\r\n/>"
