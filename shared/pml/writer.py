"""Writing PML: schemas and prompts from the model as text that parse_schema and
parse_prompt read back to the same tree. ElementTree does the escaping, so any text
(``<``, ``&``, quotes, newlines in arguments) survives the trip.
"""

import xml.etree.ElementTree as ET
from collections.abc import Sequence

from meancache.shared.pml.model import (
    Import,
    Module,
    Node,
    Param,
    Prompt,
    PromptNode,
    Role,
    Schema,
    Text,
    Union,
)


def write_schema(schema: Schema) -> str:
    """The ``<schema>`` document for ``schema``."""
    root = ET.Element("schema", name=schema.name)
    _append(root, schema.children)
    return ET.tostring(root, encoding="unicode")


def write_prompt(prompt: Prompt) -> str:
    """The ``<prompt>`` document for ``prompt``."""
    root = ET.Element("prompt", schema=prompt.schema)
    _append(root, prompt.children)
    return ET.tostring(root, encoding="unicode")


def _append(parent: ET.Element, nodes: Sequence[Node | PromptNode]) -> None:
    """Text goes into the parent's text or the previous child's tail, as XML keeps it."""
    previous: ET.Element | None = None
    for node in nodes:
        if isinstance(node, Text):
            if not node.text.strip():
                # The parser drops whitespace-only runs (indentation), so it would be lost.
                raise ValueError("PML cannot keep a text node that is only whitespace")
            if previous is None:
                parent.text = (parent.text or "") + node.text
            else:
                previous.tail = (previous.tail or "") + node.text
        else:
            previous = _element(parent, node)


def _element(parent: ET.Element, node: Role | Module | Param | Union | Import) -> ET.Element:
    if isinstance(node, Param):
        return ET.SubElement(parent, "param", name=node.name, len=str(node.length))
    if isinstance(node, Role):
        element = ET.SubElement(parent, node.role)
        _append(element, node.children)
    elif isinstance(node, Module):
        element = ET.SubElement(parent, "module", name=node.name)
        _append(element, node.children)
    elif isinstance(node, Union):
        element = ET.SubElement(parent, "union")
        _append(element, node.members)
    else:
        element = ET.SubElement(parent, node.name, node.args)
        _append(element, node.children)
    return element
