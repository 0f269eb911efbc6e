"""The first screen: the start's steps, drawn before the program's heavy parts load, and
the question prompt, so that what a user types from the first frame is kept."""

from meancache.client.tui.start_steps import StartSteps
from meancache.client.tui.widgets import (
    QUESTION_PLACEHOLDER,
    QuestionInput,
    StatusLine,
    held_question,
)
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Input


class StartScreen(Screen[None]):
    """Shown from the first frame until the chat screen is built, which takes over what was
    typed here (``typed``) and the question sent here (``sent``) to ask once it can."""

    AUTO_FOCUS = "#question"
    DEFAULT_CSS = "#question { dock: bottom; }"

    def __init__(self, start: StartSteps) -> None:
        super().__init__()
        self.start = start
        self.sent: str | None = None

    def compose(self) -> ComposeResult:
        yield Header()
        yield StatusLine(self.start)
        yield QuestionInput(placeholder=QUESTION_PLACEHOLDER, id="question")
        yield Footer()

    @property
    def typed(self) -> str:
        """The prompt's text, not yet sent."""
        return self.query_one("#question", Input).value

    def on_input_submitted(self, event: Input.Submitted) -> None:
        self.sent = held_question(event, self.sent)
