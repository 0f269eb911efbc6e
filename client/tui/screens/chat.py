"""The chat: lays out the questions, the streamed answers with their source and the status
line, and reacts to keys. What an action does lives in a service (client/chat, client/fl,
the pack update); the screen runs it in a worker, a blocking one in a thread."""

import asyncio
from collections.abc import Awaitable, Callable
from typing import cast

from meancache.client.chat.answering import OnDelta
from meancache.client.chat.conversations import Conversation, Document, Turn
from meancache.client.chat.history import ChatHistory
from meancache.client.chat.rejection import reject_last
from meancache.client.chat.session import ChatSession
from meancache.client.config import Settings
from meancache.client.errors import UpstreamRequestError, UpstreamUnavailableError
from meancache.client.fl.participation import FederatedParticipation
from meancache.client.tui.bindings import CHAT_BINDINGS, why_not
from meancache.client.tui.federation import FederationControl
from meancache.client.tui.jobs import run_blocking
from meancache.client.tui.packs import describe_update, update_pack
from meancache.client.tui.screens.attach import AttachScreen
from meancache.client.tui.screens.conversations import ConversationChoice, ConversationsScreen
from meancache.client.tui.screens.stats import StatsScreen, session_rows
from meancache.client.tui.start_steps import StartSteps
from meancache.client.tui.text import printable
from meancache.client.tui.welcome import welcome
from meancache.client.tui.widgets import (
    QUESTION_PLACEHOLDER,
    AnswerView,
    MessageList,
    QuestionInput,
    StatusLine,
    held_question,
    take_sent,
)
from meancache.shared.errors import MeanCacheError
from meancache.shared.progress import Progress
from textual import work
from textual.app import ComposeResult
from textual.screen import Screen
from textual.widgets import Footer, Header, Input


class ChatScreen(Screen[None]):
    """The chat: given the settings when built and the session once it is open (``ready``),
    so that it needs nothing from the app that hosts it."""

    BINDINGS = CHAT_BINDINGS
    AUTO_FOCUS = "#question"
    DEFAULT_CSS = "#question { dock: bottom; }"

    def __init__(self, settings: Settings, federation: FederatedParticipation,
                 start: StartSteps | None = None) -> None:
        """``federation``: this device's SuperNode, built by the app; ``start``: the app's
        start, which the status line goes on showing."""
        super().__init__()
        self.settings = settings
        self.conversation = Conversation()
        self.busy = False
        self._session: ChatSession | None = None
        self._waiting: str | None = None  # a question sent before the session was open
        self.messages = MessageList(welcome(settings), id="messages")
        self.status_line = StatusLine(start)
        self.federation = federation
        self.fl = FederationControl(federation, self.progress)

    def compose(self) -> ComposeResult:
        yield Header()
        yield self.messages
        yield self.status_line
        yield self.fl
        # open from the first frame: a question typed while the cache starts waits for it
        yield QuestionInput(placeholder=QUESTION_PLACEHOLDER, id="question")
        yield Footer()

    # state --------------------------------------------------------------------------
    @property
    def session(self) -> ChatSession:
        """The chat session; actions that use it are disabled until it is open."""
        return cast(ChatSession, self._session)

    @property
    def history(self) -> ChatHistory:
        return ChatHistory.of(self.session)

    def take_over(self, typed: str, sent: str | None) -> None:
        """What the start screen's prompt held when this screen took its place: its text,
        before whatever reached this prompt while the screen was being shown, and the
        question sent there, which waits (a later one sent here goes back to the prompt)."""
        question = self.query_one("#question", Input)
        question.value = typed + question.value
        if sent is not None:
            if self._waiting is not None:  # sent after the start screen's: back to the prompt
                question.value = f"{self._waiting} {question.value}".strip()
            self._waiting = sent

    def ready(self, session: ChatSession) -> None:
        self._session = self.fl.session = session
        self.status_line.follow(session, self.fl.describe)
        self.query_one("#question", Input).focus()
        self.refresh_bindings()
        if self._waiting is not None:
            question, self._waiting = self._waiting, None
            self.ask(question)

    def failed(self, message: str) -> None:
        self.status_line.start.end()
        self.status_line.idle(f"cannot start: {message}")
        if self._waiting is not None:  # nothing will answer it: it goes back where it was typed
            self.query_one("#question", Input).value, self._waiting = self._waiting, None

    def start_step(self, name: str) -> Progress:
        """The start's step ``name`` begins (from the worker that opens the session): the
        status line names it; the callback returned reports its progress."""
        self._from_worker(lambda line: line.begin_step(name))
        return lambda done, total: self._from_worker(
            lambda line: line.step_progress(done, total))

    def progress(self, label: str) -> Progress:
        """A (done, total) callback, safe to call from a worker thread."""
        return lambda done, total: self._from_worker(lambda line: line.work(label, done,
                                                                            total))

    def _from_worker(self, show: Callable[[StatusLine], None]) -> None:
        """``show`` on the status line, from a worker's thread, run on the app's; nothing
        once the app shuts down, when the line may be taken down already."""
        def run() -> None:
            if self.app.is_running:
                show(self.status_line)
        self.app.call_from_thread(run)

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.refresh_bindings()

    def last_answer(self) -> AnswerView | None:
        return self.messages.last_answer()

    def why_not(self, action: str) -> str | None:
        """Why the chat action ``action`` cannot act now, or None when it can (the rules:
        client/tui/bindings.py). The footer dims such a key; pressing it shows this line."""
        return why_not(action, started=self._session is not None, busy=self.busy,
                       conversation=self.conversation, settings=self.settings)

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        """A chat action that cannot act now stays in the footer, dimmed."""
        return True if self.why_not(action) is None else None

    def show_conversation(self, conversation: Conversation) -> None:
        self.conversation = conversation
        self.messages.show(conversation)
        self.sub_title = printable(conversation.title)
        self.refresh_bindings()

    def on_federation_control_changed(self) -> None:
        self.status_line.idle()

    # answering ----------------------------------------------------------------------
    def on_input_submitted(self, event: Input.Submitted) -> None:
        question = event.value.strip()
        if not question or self.busy:
            return
        if self._session is None:
            self._waiting = held_question(event, self._waiting)
            return
        take_sent(event)
        self.ask(question)

    async def _streamed(self, view: AnswerView, answer: Callable[[OnDelta], Awaitable[Turn]],
                        failed: str) -> Turn | None:
        """Stream ``answer`` into ``view``; None, with a notice, when it failed."""
        self.set_busy(True)
        try:
            turn = await self.messages.stream(view, answer)
        except asyncio.CancelledError:
            view.fail("stopped: nothing was cached")
            raise
        except UpstreamRequestError as exc:
            view.fail(f"{failed}: {exc}")
            self.notify(str(exc), title="Upstream unavailable", severity="error")
            if isinstance(exc, UpstreamUnavailableError):
                self._heard_from_upstream(str(exc))
        except MeanCacheError as exc:
            view.fail(str(exc))
            self.notify(str(exc), severity="error")
        else:
            if turn.source == "upstream":
                self._heard_from_upstream(None)
            return turn
        finally:
            self.set_busy(False)
        return None

    def _heard_from_upstream(self, problem: str | None) -> None:
        """The status line says whether the upstream answers as last found."""
        if self.session.heard_from_upstream(problem):
            self.status_line.idle()

    @work(exclusive=True, group="answer")
    async def ask(self, question: str) -> None:
        view = await self.messages.add_question(question)
        turn = await self._streamed(view, lambda show: self.session.answers.answer(
            self.conversation, question, show), "no answer")
        if turn is None:
            return
        self.sub_title = printable(self.conversation.title)
        view.show(turn)
        if turn.truncated:
            self.notify("The question is longer than the embedding model's window: only its "
                        "beginning was used to match cached questions.", severity="warning")
        self.refresh_bindings()

    def action_cancel(self) -> None:
        self.workers.cancel_group(self, "answer")

    @work(exclusive=True, group="answer")
    async def action_reject(self) -> None:
        """Whatever fails, the app stays up: a notice says why, the badge too."""
        view = self.last_answer()
        if view is None:
            return
        view.markdown.update("")
        view.badge.update("wrong answer noted; asking the upstream…")

        async def reject(show: OnDelta) -> Turn:
            correction = await reject_last(self.session.answers, self.conversation, show)
            if correction.threshold is not None:
                self.notify(str(correction.threshold), title="Threshold")
            return correction.turn

        turn = await self._streamed(view, reject, "the upstream could not answer")
        if turn is not None:
            view.show(turn)
        self.refresh_bindings()

    # other actions ------------------------------------------------------------------
    def action_new_chat(self) -> None:
        self.workers.cancel_group(self, "answer")
        self.show_conversation(Conversation())

    @work(thread=True, exclusive=True, group="stats")
    def action_stats(self) -> None:
        self.app.call_from_thread(self.app.push_screen, StatsScreen(session_rows(self.session)))

    @work(thread=True, exclusive=True, group="history")
    def action_conversations(self) -> None:
        screen = ConversationsScreen(self.history, self.history.list(), self._chat_deleted)
        self.app.call_from_thread(self.app.push_screen, screen, self._conversation_chosen)

    def _conversation_chosen(self, choice: ConversationChoice | None) -> None:
        if choice is not None and choice.action == "new":
            self.action_new_chat()
        elif choice is not None and choice.conversation is not None:
            self.show_conversation(choice.conversation)

    def _chat_deleted(self, conversation: Conversation) -> None:
        if self.conversation.id == conversation.id:
            self.show_conversation(Conversation())

    def action_export(self) -> None:
        history, conversation = self.history, self.conversation
        run_blocking(self, lambda: f"Exported to {history.export(conversation)}",
                     group="history", title="Export", failed="Cannot export")

    def action_attach(self) -> None:
        self.app.push_screen(AttachScreen(self.session.answers, self.conversation,
                                          self.history), self._attached)

    def _attached(self, document: Document | None) -> None:
        if document is not None:
            self.messages.add_notice(
                f"attached {document.path} ({document.chars} characters): sent before each "
                "question, kept as a module by a meancache upstream")

    def action_pack_update(self) -> None:
        session, progress = self.session, self.progress("downloading the instruction pack…")
        run_blocking(self, lambda: describe_update(update_pack(session, progress)),
                     group="pack", title="Instruction pack",
                     failed="Pack update failed; the pack in use stays",
                     then=self.status_line.idle)

    def action_fl_sync(self) -> None:
        self.fl.sync()

    def action_fl_join(self) -> None:
        self.fl.toggle()
