"""Past chats: open one, start a new one, delete one, export one as Markdown. Deleting and
exporting happen here (in workers); opening and starting one are the chat's to do."""

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from meancache.client.chat.conversations import Conversation
from meancache.client.chat.history import ChatHistory
from meancache.client.tui.screens.confirm_delete import ConfirmDeleteScreen, Deletion
from meancache.client.tui.text import printable
from meancache.shared.errors import MeanCacheError
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, OptionList
from textual.widgets.option_list import Option


@dataclass(frozen=True)
class ConversationChoice:
    action: Literal["open", "new"]
    conversation: Conversation | None = None


class ConversationsScreen(ModalScreen[ConversationChoice | None]):
    DEFAULT_CSS = """
    ConversationsScreen { align: center middle; }
    ConversationsScreen > Vertical { width: 80%; height: 80%; border: round $accent;
                                     background: $surface; }
    """
    BINDINGS = [
        Binding("enter", "open", "Open", id="conversations.open", show=False),
        Binding("n", "new", "New chat", id="conversations.new"),
        Binding("d", "delete", "Delete", id="conversations.delete"),
        Binding("e", "export", "Export .md", id="conversations.export"),
        Binding("escape", "close", "Close", id="conversations.close"),
    ]

    def __init__(self, history: ChatHistory, conversations: list[Conversation],
                 deleted: Callable[[Conversation], None]) -> None:
        """``conversations``: listed by the caller, off the UI thread; ``deleted`` is called
        on the UI thread once a chat is gone."""
        super().__init__()
        self.history = history
        self.conversations = conversations
        self.deleted = deleted

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversations — enter open · n new · d delete · e export · esc close")
            yield OptionList(*self._options(), id="conversation-list")
            yield Footer()

    def _options(self) -> list[Option]:
        return [Option(printable(f"{datetime.fromtimestamp(c.created):%Y-%m-%d %H:%M}  "
                                 f"{c.title[:60]}  ({len(c.turns)} turns)"), id=c.id)
                for c in self.conversations]

    def _selected(self) -> Conversation | None:
        index = self.query_one(OptionList).highlighted
        return None if index is None else self.conversations[index]

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(ConversationChoice("open", self.conversations[event.option_index]))

    def action_open(self) -> None:
        if (chosen := self._selected()) is not None:
            self.dismiss(ConversationChoice("open", chosen))

    def action_new(self) -> None:
        self.dismiss(ConversationChoice("new"))

    def action_close(self) -> None:
        self.dismiss(None)

    def action_delete(self) -> None:
        if (chosen := self._selected()) is not None:
            self.app.push_screen(ConfirmDeleteScreen(chosen),
                                 lambda how: self.delete(chosen, how) if how else None)

    @work(thread=True, exclusive=True, group="history")
    def delete(self, conversation: Conversation, how: Deletion) -> None:
        try:
            dropped = self.history.delete(conversation, how == "chat-and-cache")
            listed = self.history.list()
        except MeanCacheError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.app.call_from_thread(self._deleted, conversation, dropped, listed)

    def _deleted(self, conversation: Conversation, dropped: int,
                 listed: list[Conversation]) -> None:
        self.deleted(conversation)
        self.conversations = listed
        options = self.query_one(OptionList)
        options.clear_options()
        options.add_options(self._options())
        self.notify("Chat deleted" + (f" with {dropped} cached answers." if dropped else "."))

    @work(thread=True, exclusive=True, group="history")
    def action_export(self) -> None:
        chosen = self.app.call_from_thread(self._selected)
        if chosen is None:
            return
        try:
            path = self.history.export(chosen)
        except MeanCacheError as exc:
            self.app.call_from_thread(self.notify, str(exc), severity="error")
            return
        self.app.call_from_thread(self.notify, f"Exported to {path}", title="Export")
