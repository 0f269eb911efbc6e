"""The chat app: opens the chat session in a worker, then hosts the chat screen, the
conversation list and the stats view; every action is also in the command palette."""

import logging
from collections.abc import Iterable
from pathlib import Path

from meancache.client.chat.conversations import Conversation
from meancache.client.chat.session import ChatSession, UpstreamStarter
from meancache.client.config import Settings
from meancache.client.errors import ConversationNotFoundError
from meancache.client.tui.screens.chat import CHAT_BINDINGS, ChatScreen
from meancache.client.tui.screens.conversations import ConversationChoice, ConversationsScreen
from meancache.client.tui.screens.stats import StatsScreen, stats_rows
from meancache.shared.errors import MeanCacheError
from textual import work
from textual.app import App, SystemCommand
from textual.screen import Screen
from textual.widgets import Static

log = logging.getLogger(__name__)


class MeanCacheApp(App[None]):
    TITLE = "meancache"
    SUB_TITLE = "New chat"

    def __init__(self, settings: Settings, start_upstream: UpstreamStarter | None = None
                 ) -> None:
        super().__init__()
        self.settings = settings
        self.start_upstream = start_upstream
        self.session: ChatSession | None = None
        self.chat = ChatScreen()
        if settings.keymap:
            self.set_keymap(settings.keymap)

    def on_mount(self) -> None:
        self.push_screen(self.chat)
        self.open_session()

    @work(thread=True, exclusive=True, group="session")
    def open_session(self) -> None:
        """Loading the encoder and starting the embedded upstream takes seconds."""
        try:
            session = ChatSession.open(self.settings, start_upstream=self.start_upstream)
        except MeanCacheError as exc:
            self.call_from_thread(self._failed, str(exc))
            return
        self.call_from_thread(self._opened, session)

    def _opened(self, session: ChatSession) -> None:
        self.session = session
        self.chat.ready(session.upstream_label)
        if session.embedded is not None:
            self.notify(f"No upstream configured: started the {session.upstream_label}.",
                        title="Embedded upstream")

    def _failed(self, message: str) -> None:
        self.chat.query_one("#status", Static).update(f"cannot start: {message}")
        self.notify(message, title="Cannot start", severity="error", timeout=30)

    async def on_unmount(self) -> None:
        if self.session is not None:
            await self.session.aclose()

    # actions shared by screens ------------------------------------------------------
    def action_stats(self) -> None:
        if self.session is not None:
            self.push_screen(StatsScreen(stats_rows(self.session.cache.stats(), None)))

    def action_conversations(self) -> None:
        if self.session is None:
            return
        self.push_screen(ConversationsScreen(self.session.conversations.list()),
                         self._conversation_chosen)

    def _conversation_chosen(self, choice: ConversationChoice | None) -> None:
        if choice is None or self.session is None:
            return
        store = self.session.conversations
        if choice.action == "new":
            self.chat.action_new_chat()
            return
        try:
            if choice.action == "open" and choice.conversation_id:
                self.chat.show_conversation(store.load(choice.conversation_id))
            elif choice.action == "delete" and choice.conversation_id:
                store.delete(choice.conversation_id)
                if self.chat.conversation.id == choice.conversation_id:
                    self.chat.show_conversation(Conversation())
                self.notify("Chat deleted.")
                self.action_conversations()
            elif choice.action == "export" and choice.conversation_id:
                path = self.export_conversation(store.load(choice.conversation_id))
                self.notify(f"Exported to {path}", title="Export")
        except ConversationNotFoundError as exc:
            self.notify(str(exc), severity="error")

    def export_conversation(self, conversation: Conversation) -> Path:
        directory = self.settings.data_dir / "exports"
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / f"chat-{conversation.id}.md"
        path.write_text(conversation.to_markdown(), encoding="utf-8")
        return path

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for binding in CHAT_BINDINGS:
            yield SystemCommand(str(binding.description), binding.tooltip,
                                lambda action=binding.action: self.chat.run_action(action))
