"""The chat: questions, streamed answers with their source, and every action on them."""

import asyncio
import threading
from collections.abc import Callable
from pathlib import Path
from typing import cast

from meancache.client.chat.conversations import Conversation
from meancache.client.chat.session import ChatSession
from meancache.client.config import Settings
from meancache.client.errors import ConversationNotFoundError, UpstreamRequestError
from meancache.client.tui.federated import (
    FederatedParticipation,
    switch_to_latest,
    sync_and_switch,
)
from meancache.client.tui.packs import describe_pack, update_pack
from meancache.client.tui.screens.attach import AttachScreen
from meancache.client.tui.screens.confirm_delete import (
    ConfirmDeleteScreen,
    Deletion,
    created_entries,
)
from meancache.client.tui.screens.conversations import ConversationChoice, ConversationsScreen
from meancache.client.tui.screens.stats import StatsScreen, stats_rows
from meancache.client.tui.text import printable
from meancache.client.tui.widgets import AnswerView, QuestionView
from meancache.shared.errors import MeanCacheError
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.events import Paste
from textual.screen import Screen
from textual.timer import Timer
from textual.widgets import Footer, Header, Input, Markdown, ProgressBar, Static

# Every action, with a binding id (remappable through `keymap` in config.toml) and the
# help the command palette shows.
CHAT_BINDINGS = [
    Binding("ctrl+r", "reject", "Wrong answer", id="reject",
            tooltip="Re-ask the upstream and replace this cached (or empty) answer; a cached "
                    "one re-tunes the threshold"),
    Binding("escape", "cancel", "Stop", id="cancel", tooltip="Stop the answer being streamed"),
    Binding("ctrl+n", "new_chat", "New chat", id="new_chat", tooltip="Start a new chat"),
    Binding("ctrl+o", "conversations", "Chats", id="conversations",
            tooltip="Open, delete or export past chats"),
    Binding("ctrl+l", "attach", "Attach", id="attach",
            tooltip="Attach a text file as a Prompt Cache module"),
    Binding("ctrl+s", "export", "Export", id="export",
            tooltip="Export this chat as Markdown"),
    Binding("ctrl+t", "stats", "Stats", id="stats", tooltip="Hit rate, thresholds, sizes"),
    Binding("f6", "pack_update", "Update pack", id="pack_update",
            tooltip="Download the upstream's newest instruction pack (answered on the device)"),
    Binding("f7", "fl_sync", "Sync model", id="fl_sync",
            tooltip="Download the newest federated global model (needs fl_server_url)"),
    Binding("f8", "fl_join", "Join FL", id="fl_join",
            tooltip="Train in federated rounds on this device's feedback (needs fl_superlink); "
                    "press again to leave"),
]


class QuestionInput(Input):
    """An input that keeps every line of a multi-line paste (joined by spaces)."""

    def _on_paste(self, event: Paste) -> None:
        if event.text:
            self.insert_text_at_cursor(" ".join(event.text.split()))
        event.prevent_default()  # Input's own handler would paste the first line again
        event.stop()


class ChatScreen(Screen[None]):
    """The chat: given the settings when built and the session once it is open (``ready``),
    so that it needs nothing from the app that hosts it."""

    BINDINGS = CHAT_BINDINGS
    DEFAULT_CSS = """
    #messages { height: 1fr; padding: 0 1; }
    #status { height: 1; color: $text-muted; padding: 0 1; }
    #question { dock: bottom; }
    #progress { display: none; height: 1; padding: 0 1; }
    #progress.active { display: block; }
    .notice { color: $text-muted; margin: 1 0 0 0; }
    """

    def __init__(self, settings: Settings) -> None:
        super().__init__()
        self.settings = settings
        self.conversation = Conversation()
        self.busy = False
        self._session: ChatSession | None = None
        self.federation = FederatedParticipation(settings)
        self._rounds_timer: Timer | None = None
        self._showing_cache_work = False
        self._joining = threading.Lock()  # a second F8 waits for the first to finish

    def compose(self) -> ComposeResult:
        yield Header()
        yield VerticalScroll(id="messages")
        yield Static("loading the cache and the upstream…", id="status", markup=False)
        yield ProgressBar(id="progress", show_eta=False)
        yield QuestionInput(placeholder="Ask anything (enter to send)", id="question",
                            disabled=True)
        yield Footer()

    # state --------------------------------------------------------------------------
    @property
    def session(self) -> ChatSession:
        """The chat session; actions that use it are disabled until it is open."""
        return cast(ChatSession, self._session)

    def ready(self, session: ChatSession) -> None:
        self._session = session
        self.query_one("#progress", ProgressBar).remove_class("active")
        self.query_one("#status", Static).update(session.upstream_label)
        question = self.query_one("#question", Input)
        question.disabled = False
        question.focus()
        self.refresh_bindings()
        self.set_interval(0.5, self._show_cache_work, name="cache-work")

    def failed(self, message: str) -> None:
        self.query_one("#progress", ProgressBar).remove_class("active")
        self.query_one("#status", Static).update(f"cannot start: {message}")

    def set_busy(self, busy: bool) -> None:
        self.busy = busy
        self.refresh_bindings()

    def last_answer(self) -> AnswerView | None:
        views = list(self.query(AnswerView))
        return views[-1] if views else None

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "reject":
            turns = self.conversation.turns
            rejectable = bool(turns) and (turns[-1].source.from_cache or turns[-1].empty)
            return True if rejectable and not self.busy and self._session else None
        if action == "cancel":
            return True if self.busy else None
        if action in ("attach", "stats", "export", "new_chat", "conversations",
                      "pack_update"):
            return True if self._session else None
        if action == "fl_sync":
            return True if self._session and self.settings.fl_server_url else None
        if action == "fl_join":
            return True if self._session and self.settings.fl_superlink else None
        return True

    def show_conversation(self, conversation: Conversation) -> None:
        self.conversation = conversation
        messages = self.query_one("#messages", VerticalScroll)
        messages.remove_children()
        for doc in conversation.documents:
            messages.mount(self._notice(f"attached {doc.path}"))
        for turn in conversation.turns:
            messages.mount(QuestionView(turn.question))
            messages.mount(AnswerView(turn))
        messages.scroll_end(animate=False)
        self.sub_title = printable(conversation.title)
        self.refresh_bindings()

    def _notice(self, text: str) -> Static:
        return Static(printable(text), classes="notice", markup=False)

    # asking -------------------------------------------------------------------------
    def on_input_submitted(self, event: Input.Submitted) -> None:
        question = event.value.strip()
        if not question or self.busy or self._session is None:
            return
        event.input.value = ""
        self.ask(question)

    @work(exclusive=True, group="answer")
    async def ask(self, question: str) -> None:
        messages = self.query_one("#messages", VerticalScroll)
        view = AnswerView()
        await messages.mount(QuestionView(question))
        await messages.mount(view)
        messages.scroll_end(animate=False)
        stream = Markdown.get_stream(view.markdown)
        self.set_busy(True)

        async def show(text: str) -> None:
            await stream.write(printable(text))
            messages.scroll_end(animate=False)

        try:
            turn = await self.session.answers.answer(self.conversation, question, show)
        except asyncio.CancelledError:
            view.fail("stopped: nothing was cached")
            raise
        except UpstreamRequestError as exc:
            view.fail(f"no answer: {exc}")
            self.notify(str(exc), title="Upstream unavailable", severity="error")
            return
        except MeanCacheError as exc:
            view.fail(str(exc))
            self.notify(str(exc), severity="error")
            return
        finally:
            await stream.stop()
            self.set_busy(False)
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
        view = self.last_answer()
        index = len(self.conversation.turns) - 1
        if view is None or index < 0:
            return
        view.markdown.update("")
        view.badge.update("wrong answer noted; asking the upstream…")
        stream = Markdown.get_stream(view.markdown)
        self.set_busy(True)
        try:
            correction = await self.session.answers.reject(self.conversation, index,
                                                           lambda t: stream.write(printable(t)))
        except UpstreamRequestError as exc:
            view.fail(f"the upstream could not answer: {exc}")
            self.notify(str(exc), title="Upstream unavailable", severity="error")
            return
        finally:
            await stream.stop()
            self.set_busy(False)
        view.show(correction.turn)
        if correction.threshold is not None:
            self.notify(str(correction.threshold), title="Threshold")
        self.refresh_bindings()

    # other actions ------------------------------------------------------------------
    def action_new_chat(self) -> None:
        self.workers.cancel_group(self, "answer")
        self.show_conversation(Conversation())

    def action_stats(self) -> None:
        packs = self.session.answers.packs
        self.app.push_screen(StatsScreen(stats_rows(self.session.cache.stats(),
                                                    None if packs is None else
                                                    describe_pack(packs.stats()))))

    def action_conversations(self) -> None:
        self.app.push_screen(ConversationsScreen(self.session.conversations.list()),
                             self._conversation_chosen)

    def _conversation_chosen(self, choice: ConversationChoice | None) -> None:
        if choice is None:
            return
        store = self.session.conversations
        if choice.action == "new":
            self.action_new_chat()
            return
        try:
            if choice.action == "open" and choice.conversation_id:
                self.show_conversation(store.load(choice.conversation_id))
            elif choice.action == "delete" and choice.conversation_id:
                doomed = store.load(choice.conversation_id)
                self.app.push_screen(ConfirmDeleteScreen(doomed),
                                     lambda how: self._delete_confirmed(doomed, how))
            elif choice.action == "export" and choice.conversation_id:
                path = self.export_conversation(store.load(choice.conversation_id))
                self.notify(f"Exported to {path}", title="Export")
        except ConversationNotFoundError as exc:
            self.notify(str(exc), severity="error")

    def _delete_confirmed(self, conversation: Conversation, how: Deletion | None) -> None:
        if how is not None:
            try:
                self.session.conversations.delete(conversation.id)
            except ConversationNotFoundError as exc:
                self.notify(str(exc), severity="error")
                return
            dropped = 0
            if how == "chat-and-cache":
                dropped = sum(self.session.cache.delete(entry_id)
                              for entry_id in created_entries(conversation))
            if self.conversation.id == conversation.id:
                self.show_conversation(Conversation())
            self.notify("Chat deleted" + (f" with {dropped} cached answers." if dropped
                                          else "."))
        self.action_conversations()

    def export_conversation(self, conversation: Conversation) -> Path:
        directory = self.settings.data_dir / "exports"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"chat-{conversation.id}.md"
        path.write_text(conversation.to_markdown(), encoding="utf-8")
        return path

    def action_export(self) -> None:
        if not self.conversation.turns:
            self.notify("Nothing to export yet.", severity="warning")
            return
        path = self.export_conversation(self.conversation)
        self.notify(f"Exported to {path}", title="Export")

    def action_attach(self) -> None:
        def attach(path: str | None) -> None:
            if path:
                self.attach(Path(path))

        self.app.push_screen(AttachScreen(), attach)

    @work(exclusive=True, group="attach")
    async def attach(self, path: Path) -> None:
        status = self.query_one("#status", Static)
        status.update(f"attaching {path}…")
        try:
            document = await self.session.answers.attach(self.conversation, path)
        except MeanCacheError as exc:
            self.notify(str(exc), title="Cannot attach", severity="error")
            return
        finally:
            status.update(self.session.upstream_label)
        self.session.conversations.save(self.conversation)
        await self.query_one("#messages", VerticalScroll).mount(
            self._notice(f"attached {document.path}: {document.tokens} tokens cached as "
                         "modules on the upstream; this chat's answers reuse them"))
        self.notify(f"{path.name} attached ({document.tokens} tokens)", title="Attached")

    # federated learning -------------------------------------------------------------
    def progress(self, label: str) -> Callable[[int, int], None]:
        """A (done, total) callback, safe to call from a worker thread: the widgets are
        looked up and changed on the app's thread."""

        def update(done: int, total: int) -> None:
            def show() -> None:
                bar = self.query_one("#progress", ProgressBar)
                bar.add_class("active")
                bar.update(total=total or None, progress=done)
                self.query_one("#status", Static).update(label)
            self.app.call_from_thread(show)

        return update

    def _progress_done(self) -> None:
        self.query_one("#progress", ProgressBar).remove_class("active")
        self._show_status()

    def _show_cache_work(self) -> None:
        """The cache's own long work (re-embedding, fitting PCA) runs on its thread while
        answers go on; its progress shows here until it is done."""
        status = self.session.cache.background.status()
        if status is None and self.session.answers.packs is not None:
            status = self.session.answers.packs.embeddings.status()
        if status is None:
            if self._showing_cache_work:
                self._showing_cache_work = False
                self._progress_done()
            return
        self._showing_cache_work = True
        bar = self.query_one("#progress", ProgressBar)
        bar.add_class("active")
        bar.update(total=status.total or None, progress=status.done)
        self.query_one("#status", Static).update(f"{status.label} (answers go on meanwhile)…")

    def _status_line(self) -> str:
        line = self.session.upstream_label
        if self.federation.running:
            line += f" · federated learning: joined {self.settings.fl_superlink}"
            if self.federation.known_round is not None:
                line += f" (global model of round {self.federation.known_round})"
        return line

    def _show_status(self) -> None:
        self.query_one("#status", Static).update(self._status_line())

    @work(thread=True, exclusive=True, group="pack")
    def action_pack_update(self) -> None:
        try:
            update = update_pack(self.session, self.progress("downloading the instruction "
                                                             "pack…"))
        except MeanCacheError as exc:
            self.app.call_from_thread(self.notify, f"{exc}; the pack in use stays",
                                      title="Pack update failed", severity="error")
            return
        finally:
            self.app.call_from_thread(self._progress_done)
        manifest = update.manifest
        message = (f"pack {manifest.pack_id}: {manifest.count} instructions now answered on "
                   "this device" if update.changed else
                   f"already up to date (pack {manifest.pack_id})")
        self.app.call_from_thread(self.notify, message, title="Instruction pack")

    @work(thread=True, exclusive=True, group="fl")
    def action_fl_sync(self) -> None:
        try:
            result, reembedded = sync_and_switch(
                self.session, self.progress("downloading the global model…"),
                self.progress("re-embedding cached questions…"))
        except MeanCacheError as exc:
            self.app.call_from_thread(self.notify, str(exc), title="Sync failed",
                                      severity="error")
            return
        finally:
            self.app.call_from_thread(self._progress_done)
        message = (f"global model of round {result.round}, threshold {result.threshold:.3f}"
                   + (f"; re-embedded {reembedded} cached questions" if reembedded else "")
                   if result.changed else f"already up to date (round {result.round})")
        self.app.call_from_thread(self.notify, message, title="Federated model")

    @work(thread=True, group="fl-join")
    def action_fl_join(self) -> None:
        """Join, or leave when joined; starting and stopping the SuperNode can block."""
        with self._joining:
            if self.federation.running:
                self.app.call_from_thread(self._stop_watching)
                self.federation.stop()
                self.app.call_from_thread(self._left)
                return
            try:
                self.federation.start()
            except (MeanCacheError, OSError) as exc:
                self.app.call_from_thread(self.notify, str(exc), title="Cannot join federated "
                                          "learning", severity="error")
                return
            self.app.call_from_thread(self._joined)

    def _joined(self) -> None:
        self._rounds_timer = self.set_interval(2.0, self._watch_rounds, name="fl-rounds")
        self.notify(f"Joined federated learning at {self.settings.fl_superlink}; "
                    "only weights, a threshold and counts leave this device.")
        self._show_status()

    def _left(self) -> None:
        self.notify("Left federated learning.")
        self._show_status()

    def _stop_watching(self) -> None:
        if self._rounds_timer is not None:
            self._rounds_timer.stop()
            self._rounds_timer = None

    def _watch_rounds(self) -> None:
        """When the SuperNode kept a newer global model, switch the cache to it."""
        new_round = self.federation.poll()
        if not self.federation.running:
            self._stop_watching()
            self.notify("The federated learning node stopped; see logs/supernode.log.",
                        severity="warning")
            self._show_status()
            return
        if new_round is not None:
            self.notify(f"Received the global model of round {new_round}; re-embedding.",
                        title="Federated model")
            self.switch_model()

    @work(thread=True, exclusive=True, group="fl")
    def switch_model(self) -> None:
        try:
            switch_to_latest(self.session, self.progress("re-embedding cached questions…"))
        finally:
            self.app.call_from_thread(self._progress_done)

    def on_unmount(self) -> None:
        """Never leave a SuperNode running after the app."""
        self._stop_watching()
        self.federation.stop()
