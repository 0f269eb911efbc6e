"""Documents attached to a chat become one PML schema on the upstream, a module each; the
chat's questions import them, so the upstream computes only the question's tokens."""

import hashlib
from pathlib import Path

from meancache.client.chat.conversations import Conversation, Document
from meancache.client.errors import DocumentError
from meancache.shared.pml import (
    Import,
    Module,
    Prompt,
    Role,
    Schema,
    Text,
    write_prompt,
    write_schema,
)

MAX_DOCUMENT_BYTES = 2 * 1024 * 1024


def read_document(path: Path) -> str:
    path = path.expanduser()
    try:
        if path.stat().st_size > MAX_DOCUMENT_BYTES:
            raise DocumentError(f"{path} is larger than {MAX_DOCUMENT_BYTES // 1024} KiB; "
                                "attach a smaller file or a part of it")
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DocumentError(f"no file {path}; check the path") from None
    except IsADirectoryError:
        raise DocumentError(f"{path} is a directory; attach one text file") from None
    except UnicodeDecodeError:
        raise DocumentError(f"{path} is not UTF-8 text; attach a plain-text file") from None
    except OSError as exc:
        raise DocumentError(f"cannot read {path}: {exc.strerror}; check its permissions"
                            ) from None
    if not text.strip():
        raise DocumentError(f"{path} is empty; attach a file with text in it")
    return text


def module_name(index: int) -> str:
    return f"doc{index}"


def chat_schema(conversation: Conversation, texts: list[str]) -> tuple[str, str]:
    """(schema name, PML) for the conversation's documents, one module each."""
    digest = hashlib.sha256("\0".join(texts).encode()).hexdigest()[:10]
    name = f"chat-{conversation.id}-{digest}"
    modules = tuple(
        Module(module_name(i), (Text(f"{Path(doc.path).name}:\n{text}\n"),))
        for i, (doc, text) in enumerate(zip(conversation.documents, texts, strict=True))
    )
    system = Role("system", (Text("Answer using the documents."),))
    return name, write_schema(Schema(name, (system, *modules)))


def document_prompt(documents: list[Document], question: str) -> str:
    """A PML prompt that imports every document module and asks ``question``."""
    imports = tuple(Import(module_name(i), {}, ()) for i in range(len(documents)))
    question_node = Role("user", (Text(question),))
    return write_prompt(Prompt(documents[-1].schema, (*imports, question_node)))
