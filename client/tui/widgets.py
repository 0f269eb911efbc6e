"""The chat's widgets: the question box, a question, an answer with its source badge,
the list of them, and the status line with its progress bar."""

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

from meancache.client.chat.conversations import Conversation, Turn
from meancache.client.tui.start_steps import StartSteps
from meancache.client.tui.text import printable
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.events import Key, Paste
from textual.widgets import Input, Markdown, ProgressBar, Static
from textual.widgets.markdown import MarkdownStream

if TYPE_CHECKING:  # heavy (the cache, torch): the app draws before they load
    from meancache.client.chat.answering import OnDelta
    from meancache.client.chat.session import ChatSession


QUESTION_PLACEHOLDER = "Ask anything (enter to send)"


def take_sent(event: Input.Submitted) -> None:
    """Take what was sent out of the prompt, leaving what was typed after it: keys read
    with the enter (typed ahead while the app started, or fast) reach the prompt before
    the enter's message reaches its handler, and clearing the prompt would drop them."""
    value = event.input.value
    if value.startswith(event.value):
        event.input.value = value[len(event.value):].lstrip()


def held_question(event: Input.Submitted, waiting: str | None) -> str | None:
    """A question sent before the chat can answer: it waits for the start (taken from the
    prompt, a notice says so) unless one already waits, which leaves this one in the
    prompt. Returns the question that waits."""
    question = event.value.strip()
    if not question:
        return waiting
    if waiting is not None:
        event.input.notify("One question already waits for the start; this one stays here.",
                           title="Still starting", timeout=4)
        return waiting
    take_sent(event)
    event.input.notify("Your question will be asked once the start is done.",
                       title="Still starting", timeout=6)
    return question


class QuestionInput(Input):
    """An input that keeps every line of a multi-line paste (joined by spaces), and sends
    on enter, or on a newline, at once: an enter typed before the app took the terminal
    reaches it as a newline (the terminal's line mode turns CR into LF), and through the
    bindings an enter acts only after the keys read with it, which would join what was
    typed after it to the question sent."""

    async def _on_key(self, event: Key) -> None:
        if event.key in ("enter", "ctrl+j"):
            event.stop()
            event.prevent_default()
            await self.action_submit()
            return
        await super()._on_key(event)

    def _on_paste(self, event: Paste) -> None:
        if event.text:
            self.insert_text_at_cursor(" ".join(event.text.split()))
        event.prevent_default()  # Input's own handler would paste the first line again
        event.stop()


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


class MessageList(VerticalScroll):
    """The chat's questions, answers and notices, kept scrolled to the newest: anchored to
    its end, so that a streaming answer and then its badge stay in view while they grow,
    until the user scrolls up (Textual releases the anchor; back at the end, or a new
    question, takes it again). An empty chat shows ``welcome`` (client/tui/welcome.py)."""

    def __init__(self, welcome: str = "", *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.welcome = welcome

    def compose(self) -> ComposeResult:
        if self.welcome:
            yield self._notice(self.welcome, "welcome")

    def on_mount(self) -> None:
        self.anchor()

    DEFAULT_CSS = """
    MessageList { height: 1fr; padding: 0 1; }
    MessageList .notice { color: $text-muted; margin: 1 0 0 0; }
    """

    def show(self, conversation: Conversation) -> None:
        self.remove_children()
        if self.welcome and not conversation.turns:
            self.mount(self._notice(self.welcome, "welcome"))
        for doc in conversation.documents:
            self.mount(self._notice(f"attached {doc.path}"))
        for turn in conversation.turns:
            self.mount_all([QuestionView(turn.question), AnswerView(turn)])
        self.scroll_end(animate=False)

    def _notice(self, text: str, kind: str = "") -> Static:
        return Static(printable(text), classes=f"notice {kind}".strip(), markup=False)

    def add_notice(self, text: str) -> None:
        self.mount(self._notice(text))

    async def add_question(self, question: str) -> AnswerView:
        """The question, and the view its answer will stream into."""
        view = AnswerView()
        await self.mount_all([QuestionView(question), view])
        self.scroll_end(animate=False)
        return view

    def last_answer(self) -> AnswerView | None:
        views = list(self.query(AnswerView))
        return views[-1] if views else None

    async def stream(self, view: AnswerView,
                     answer: "Callable[[OnDelta], Awaitable[Turn]]") -> Turn:
        """Run ``answer``, showing its text in ``view`` as it comes. The stream starts with
        the first text: one stopped before its task ran raises CancelledError (Textual 8),
        which would read as the user's "stop" when an answer fails at once."""
        stream: MarkdownStream | None = None

        async def show(text: str) -> None:
            nonlocal stream
            if not text:
                return
            if stream is None:
                stream = Markdown.get_stream(view.markdown)
            await stream.write(printable(text))  # yields: the stream's task runs

        try:
            return await answer(show)
        finally:
            if stream is not None:
                await stream.stop()


class StatusLine(Vertical):
    """Where answers come from (and whether the device is in FL rounds), or what long work
    is under way, with its progress; the cache's own background work shows here too."""

    DEFAULT_CSS = """
    StatusLine { height: auto; }
    StatusLine #status { height: 1; color: $text-muted; padding: 0 1; }
    StatusLine #progress { display: none; height: 1; padding: 0 1; }
    StatusLine #progress.active { display: block; }
    """

    def __init__(self, start: StartSteps | None = None) -> None:
        """``start``: the app's start, shown until ``follow`` (see client/tui/start_steps.py)."""
        super().__init__()
        self.session: ChatSession | None = None
        self.extra: Callable[[], str] = lambda: ""  # said after the upstream's label
        self._showing_background = False
        self.start = start or StartSteps([])

    def compose(self) -> ComposeResult:
        yield Static("loading the cache and the upstream…", id="status", markup=False)
        yield ProgressBar(id="progress", show_eta=False)

    def follow(self, session: "ChatSession", extra: Callable[[], str]) -> None:
        """The session is open: say where answers come from, and watch its caches' work."""
        self.session, self.extra = session, extra
        self.start.end()
        self.idle()
        self.set_interval(0.5, self._show_background, name="cache-work")

    # the start --------------------------------------------------------------------
    def on_mount(self) -> None:
        self._show_start()  # from the first frame
        self.set_interval(0.5, self._show_start, name="start-steps")

    def begin_step(self, name: str) -> None:
        self.start.begin(name)
        self._show_start()

    def step_progress(self, done: int, total: int) -> None:
        self.start.progress(done, total)
        self._show_start()

    def _show_start(self) -> None:
        line = self.start.line()
        if line is None or not self.is_mounted:
            return
        bar = self.query_one("#progress", ProgressBar)
        if self.start.total:
            bar.add_class("active")
            bar.update(total=self.start.total, progress=self.start.done)
        else:
            bar.remove_class("active")
        self.show(line)

    def show(self, text: str) -> None:
        self.query_one("#status", Static).update(printable(text))

    def work(self, label: str, done: int, total: int) -> None:
        bar = self.query_one("#progress", ProgressBar)
        bar.add_class("active")
        bar.update(total=total or None, progress=done)
        self.show(label)

    def idle(self, text: str | None = None) -> None:
        """No work under way: ``text``, or the session's state."""
        self.query_one("#progress", ProgressBar).remove_class("active")
        if text is None and self.session is not None:
            text = self.session.upstream_label + self.extra()
        self.show(text or "")

    def _show_background(self) -> None:
        """The cache re-embeds and fits PCA, and the pack embeds its instructions, on their
        own threads while answers go on."""
        assert self.session is not None
        status = self.session.cache.background.status()
        if status is None and self.session.answers.packs is not None:
            status = self.session.answers.packs.embeddings.status()
        if status is not None:
            self._showing_background = True
            self.work(f"{status.label} (answers go on meanwhile)…", status.done, status.total)
        elif self._showing_background:
            self._showing_background = False
            self.idle()
