"""Ask for the path of a document to attach to the chat."""

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Input, Label


class AttachScreen(ModalScreen[str | None]):
    DEFAULT_CSS = """
    AttachScreen { align: center middle; }
    AttachScreen > Vertical { width: 80; height: auto; border: round $accent;
                              background: $surface; padding: 1; }
    """
    BINDINGS = [Binding("escape", "close", "Cancel", id="attach.cancel")]

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Attach a text file: its contents become a Prompt Cache module that "
                        "later questions in this chat reuse.")
            yield Input(placeholder="path/to/file.txt", id="attach-path")

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)

    def action_close(self) -> None:
        self.dismiss(None)
