"""The chat's message widgets: a question, and an answer with its source badge."""

from meancache.client.chat.conversations import Turn
from meancache.client.tui.text import printable
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widgets import Markdown, Static


class QuestionView(Static):
    DEFAULT_CSS = """
    QuestionView { margin: 1 0 0 8; padding: 0 1; background: $primary 20%; }
    """

    def __init__(self, question: str) -> None:
        super().__init__(printable(question), markup=False)


class AnswerView(Vertical):
    """An answer; while streaming its badge says so, then shows the source."""

    DEFAULT_CSS = """
    AnswerView { height: auto; margin: 1 8 0 0; padding: 0 1; border-left: thick $accent; }
    AnswerView Markdown { margin: 0; padding: 0; }
    AnswerView .badge { color: $text-muted; }
    AnswerView.cached { border-left: thick $success; }
    """

    def __init__(self, turn: Turn | None = None) -> None:
        super().__init__()
        self.turn = turn
        self.markdown = Markdown(printable(turn.shown_answer) if turn else "")
        self.badge = Static("streaming…" if turn is None else printable(turn.badge),
                            classes="badge", markup=False)

    def compose(self) -> ComposeResult:
        yield self.markdown
        yield self.badge

    def on_mount(self) -> None:
        if self.turn is not None and self.turn.source.from_cache:
            self.add_class("cached")

    def show(self, turn: Turn) -> None:
        """The final state: the whole answer and its badge."""
        self.turn = turn
        self.markdown.update(printable(turn.shown_answer))
        self.badge.update(printable(turn.badge))
        self.set_class(turn.source.from_cache, "cached")

    def fail(self, message: str) -> None:
        self.badge.update(printable(message))
