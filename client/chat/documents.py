"""Documents attached to a chat go to the upstream as ordinary system messages before the
conversation, each marked as a module (shared.pml.marks): a meancache upstream keeps
their states and computes only what follows them, any other OpenAI-compatible upstream
reads them as the messages they are."""

from pathlib import Path

from meancache.client.chat.conversations import Document
from meancache.client.errors import DocumentError

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


INSTRUCTION = "Answer using the documents."


def document_messages(documents: list[Document], texts: list[str]) -> list[dict[str, str]]:
    """The instruction, then one system message per document (its file name, its text)."""
    return [{"role": "system", "content": INSTRUCTION}] + [
        {"role": "system", "content": f"{Path(doc.path).name}:\n{text}\n"}
        for doc, text in zip(documents, texts, strict=True)]
