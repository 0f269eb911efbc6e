"""Past chats: open one, start a new one, delete one, export one as Markdown."""

from dataclasses import dataclass
from datetime import datetime

from meancache.client.chat.conversations import Conversation
from meancache.client.tui.text import printable
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, OptionList
from textual.widgets.option_list import Option


@dataclass(frozen=True)
class ConversationChoice:
    action: str  # "open", "new", "delete" or "export"
    conversation_id: str | None = None


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

    def __init__(self, conversations: list[Conversation]) -> None:
        super().__init__()
        self.conversations = conversations

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Conversations — enter open · n new · d delete · e export · esc close")
            yield OptionList(*[
                Option(printable(f"{datetime.fromtimestamp(c.created):%Y-%m-%d %H:%M}  "
                                 f"{c.title[:60]}  ({len(c.turns)} turns)"), id=c.id)
                for c in self.conversations
            ], id="conversation-list")
            yield Footer()

    def _selected(self) -> str | None:
        options = self.query_one(OptionList)
        if options.highlighted is None:
            return None
        return options.get_option_at_index(options.highlighted).id

    def on_option_list_option_selected(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(ConversationChoice("open", event.option.id))

    def action_open(self) -> None:
        if (chosen := self._selected()) is not None:
            self.dismiss(ConversationChoice("open", chosen))

    def action_new(self) -> None:
        self.dismiss(ConversationChoice("new"))

    def action_delete(self) -> None:
        if (chosen := self._selected()) is not None:
            self.dismiss(ConversationChoice("delete", chosen))

    def action_export(self) -> None:
        if (chosen := self._selected()) is not None:
            self.dismiss(ConversationChoice("export", chosen))

    def action_close(self) -> None:
        self.dismiss(None)
