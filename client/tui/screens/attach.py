"""Attach a document to the chat: ask for its path, register it with the upstream as a
Prompt Cache module and save the chat; dismissed with the document once attached."""

import asyncio
from pathlib import Path

from meancache.client.chat.answering import AnswerService
from meancache.client.chat.conversations import Conversation, Document
from meancache.client.chat.history import ChatHistory
from meancache.shared.errors import MeanCacheError
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class AttachScreen(ModalScreen[Document | None]):
    DEFAULT_CSS = """
    AttachScreen { align: center middle; }
    AttachScreen > Vertical { width: 80; height: auto; border: round $accent;
                              background: $surface; padding: 1; }
    """
    BINDINGS = [Binding("escape", "close", "Cancel", id="attach.cancel")]

    def __init__(self, answers: AnswerService, conversation: Conversation,
                 history: ChatHistory) -> None:
        super().__init__()
        self.answers = answers
        self.conversation = conversation
        self.history = history

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Attach a text file: its contents become a Prompt Cache module that "
                        "later questions in this chat reuse.", id="attach-help")
            yield Input(placeholder="path/to/file.txt", id="attach-path")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        if path := event.value.strip():
            self.attach(Path(path))
        else:
            self.dismiss(None)

    @work(exclusive=True, group="attach")
    async def attach(self, path: Path) -> None:
        self.query_one("#attach-path", Input).disabled = True
        self.query_one("#attach-help", Label).update(f"attaching {path}…")
        try:
            document = await self.answers.attach(self.conversation, path)
            await asyncio.to_thread(self.history.save, self.conversation)
        except MeanCacheError as exc:
            self.notify(str(exc), title="Cannot attach", severity="error")
            self.dismiss(None)
            return
        self.notify(f"{path.name} attached ({document.chars} characters)", title="Attached")
        self.dismiss(document)

    def action_close(self) -> None:
        self.dismiss(None)
