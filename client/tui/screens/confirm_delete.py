"""Deleting a chat is asked, not assumed: the chat goes only on a second key, and the
answers it put in the cache go with it only if the user says so (they could be served to
any later chat)."""

from typing import Literal

from meancache.client.chat.conversations import Conversation
from meancache.client.chat.history import created_entries
from meancache.client.tui.text import printable
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label

Deletion = Literal["chat-and-cache", "chat-only"]


class ConfirmDeleteScreen(ModalScreen[Deletion | None]):
    DEFAULT_CSS = """
    ConfirmDeleteScreen { align: center middle; }
    ConfirmDeleteScreen > Vertical { width: 72; height: auto; border: round $error;
                                     background: $surface; padding: 1; }
    """
    BINDINGS = [
        Binding("y", "delete('chat-and-cache')", "Delete chat and its cached answers",
                id="delete.with_cache"),
        Binding("k", "delete('chat-only')", "Delete chat, keep cached answers",
                id="delete.chat_only"),
        Binding("escape,n", "cancel", "Cancel", id="delete.cancel"),
    ]

    def __init__(self, conversation: Conversation) -> None:
        super().__init__()
        self.conversation = conversation

    def compose(self) -> ComposeResult:
        cached = len(created_entries(self.conversation))
        with Vertical():
            yield Label(f"Delete the chat “{printable(self.conversation.title[:50])}” "
                        f"({len(self.conversation.turns)} turns)?", markup=False)
            yield Label(f"y delete it and the {cached} answers it cached · k delete it, keep "
                        "its cached answers · n/esc cancel", markup=False)
            yield Footer()

    def action_delete(self, how: Deletion) -> None:
        self.dismiss(how)

    def action_cancel(self) -> None:
        self.dismiss(None)
