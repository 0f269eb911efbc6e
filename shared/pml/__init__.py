"""PML, the Prompt Markup Language of Prompt Cache (Gim et al., 2023): parser, validator
and writer.

A ``<schema>`` declares reusable prompt modules (``<module>``, nested or grouped in
mutually exclusive ``<union>``\\ s) with ``<param>`` slots of a fixed token length; a
``<prompt>`` imports modules by name as tags, passes arguments as attributes and adds new
text. The server precomputes each module's attention states at fixed positions, so the
exact text kept here matters.

Text rules:

* Whitespace: text is kept verbatim, except that a run of text that is whitespace only
  (indentation between tags) is dropped. Write it as ``<![CDATA[ ]]>`` to keep it.
  Line ends are normalised to ``\\n`` and attribute values have tabs and newlines turned
  into spaces, as XML requires (use ``&#10;`` for a newline in an argument).
* Escaping: the syntax is XML, so ``<`` and ``&`` in text must be written ``&lt;`` and
  ``&amp;`` (``&gt;``, ``&quot;``, ``&apos;`` and ``&#NNN;`` work too), or the text put in
  ``<![CDATA[...]]>``. Comments are dropped; a DOCTYPE is rejected.
* Arguments: a prompt may leave a parameter without an argument; the server then leaves
  its reserved positions empty. An argument longer than ``len`` tokens is an error
  (checked when :func:`validate_prompt` is given a token counter).

Every error is a :class:`PMLError` with a 1-based ``line`` and ``column``.
"""

from meancache.shared.errors import (
    ArgumentTooLongError,
    DuplicateImportError,
    DuplicateSchemaError,
    MisplacedContentError,
    PMLError,
    PMLSyntaxError,
    UnionConflictError,
    UnknownModuleError,
    UnknownSchemaError,
)
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
from meancache.shared.pml.parser import RESERVED_NAMES, is_prompt, parse_prompt, parse_schema
from meancache.shared.pml.registry import SchemaRegistry
from meancache.shared.pml.validate import TokenCounter, validate_prompt
from meancache.shared.pml.writer import write_prompt, write_schema

#: The Content-Type of a PML document sent over HTTP (a schema upload).
PML_MEDIA_TYPE = "application/vnd.meancache.pml+xml"

__all__ = [
    "PML_MEDIA_TYPE",
    "ROLE_NAMES",
    "RESERVED_NAMES",
    "ArgumentTooLongError",
    "DuplicateImportError",
    "DuplicateSchemaError",
    "Import",
    "MisplacedContentError",
    "Module",
    "Node",
    "PMLError",
    "PMLSyntaxError",
    "Param",
    "Position",
    "Prompt",
    "PromptNode",
    "Role",
    "RoleName",
    "Schema",
    "SchemaRegistry",
    "Text",
    "TokenCounter",
    "Union",
    "UnionConflictError",
    "UnknownModuleError",
    "UnknownSchemaError",
    "is_prompt",
    "parse_prompt",
    "parse_schema",
    "validate_prompt",
    "write_prompt",
    "write_schema",
]
