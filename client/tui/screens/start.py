"""The first screen: the start's steps, drawn before the program's heavy parts load."""

from meancache.client.tui.start_steps import StartSteps
from meancache.client.tui.widgets import StatusLine
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header


class StartScreen(Screen[None]):
    """Shown from the first frame until the chat screen is built."""

    def __init__(self, start: StartSteps) -> None:
        super().__init__()
        self.start = start

    def compose(self) -> ComposeResult:
        yield Header()
        yield StatusLine(self.start)
        yield Footer()
