"""The chat app: draws its start screen at once, loads the program's heavy parts and opens
the chat session in a worker thread (each step named on screen), then hands the session to
the chat screen, which does the rest; every chat action is also in the command palette.

This module imports nothing heavy (the cache, torch, sentence-transformers load in the
worker): a new user sees the app within a second, not after ten of bare terminal."""

import logging
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from meancache.client.chat.steps import LOADING, startup_steps
from meancache.client.config import Settings
from meancache.client.tui.bindings import CHAT_BINDINGS
from meancache.client.tui.screens.start import StartScreen
from meancache.client.tui.start_steps import StartSteps
from meancache.shared.errors import MeanCacheError
from textual import work
from textual.actions import ActionParseResult
from textual.app import App, SystemCommand
from textual.dom import DOMNode
from textual.notifications import SeverityLevel
from textual.screen import Screen

if TYPE_CHECKING:
    from meancache.client.chat.session import ChatSession, UpstreamStarter
    from meancache.client.tui.screens.chat import ChatScreen

log = logging.getLogger(__name__)


class MeanCacheApp(App[None]):
    TITLE = "meancache"
    SUB_TITLE = "New chat"

    def __init__(self, settings: Settings, start_upstream: "UpstreamStarter | None" = None
                 ) -> None:
        super().__init__()
        self.settings = settings
        self.start_upstream = start_upstream
        self.session: ChatSession | None = None
        self.start = StartSteps(startup_steps(settings))
        self._start_screen = StartScreen(self.start)
        self._chat: ChatScreen | None = None  # built once its modules are loaded
        if settings.keymap:
            self.set_keymap(settings.keymap)

    @property
    def chat(self) -> "ChatScreen":
        """The chat screen (there from the first step after loading the program)."""
        assert self._chat is not None, "the chat screen is not built yet"
        return self._chat

    def notify(self, message: str, *, title: str = "", severity: SeverityLevel = "information",
               timeout: float | None = None, markup: bool = False) -> None:
        """Always plain text: notifications quote servers' replies, file names and the
        user's text, where "[" is a character, not the start of Rich markup."""
        super().notify(message, title=title, severity=severity, timeout=timeout, markup=False)

    async def run_action(self, action: "str | ActionParseResult",
                         default_namespace: DOMNode | None = None,
                         namespaces: Mapping[str, DOMNode] | None = None) -> bool:
        """A chat key (or palette command) that cannot act says why in a notice instead
        of doing nothing."""
        if await super().run_action(action, default_namespace, namespaces):
            return True
        chat = self._chat
        why = chat.why_not(action) if chat is not None and isinstance(action, str) and (
            default_namespace is chat) else None
        if why is None:
            return False
        self.notify(why, title="Nothing to do", timeout=4)
        return True

    def action_help_quit(self) -> None:
        """Textual's ctrl+c notice is Rich markup, which ``notify`` here shows as plain
        text: the same notice, written plain."""
        for key, active in self.active_bindings.items():
            if active.binding.action in ("quit", "app.quit"):
                self.notify(f"Press {key} to quit the app", title="Do you want to quit?")
                return

    def on_mount(self) -> None:
        self.push_screen(self._start_screen)
        self.start.begin(LOADING)
        self.open_session()

    @work(thread=True, exclusive=True, group="session")
    def open_session(self) -> None:
        """Loading the program, assembling and loading the encoder and starting the
        embedded upstream take seconds (minutes on the first start): the screen names each
        step, with its time and an estimate. Nothing is drawn outside the app."""
        from meancache.client.chat.session import ChatSession
        from meancache.client.tui.screens.chat import ChatScreen

        chat = self.call_from_thread(self._show_chat, ChatScreen)
        try:
            session = ChatSession.open(self.settings, start_upstream=self.start_upstream,
                                       background=True, steps=chat.start_step)
        except MeanCacheError as exc:
            self.call_from_thread(self._failed, str(exc))
            return
        self.call_from_thread(self._opened, session)

    async def _show_chat(self, screen_class: "type[ChatScreen]") -> "ChatScreen":
        from meancache.client.fl.participation import FederatedParticipation

        self._chat = screen_class(self.settings, FederatedParticipation(self.settings),
                                  self.start)
        await self.push_screen(self._chat)  # over the start screen, which stays below
        # what the user typed and sent while the program loaded, read once keys go to the
        # chat (read before, what reached the start screen meanwhile would be lost)
        early = self._start_screen
        self._chat.take_over(early.typed, early.sent)
        return self._chat

    # The worker's last word (the session opened, or could not) may arrive while the app
    # shuts down, its screens half taken down: then there is nobody to tell, and a session
    # opened too late is closed here, since on_unmount found none.
    async def _opened(self, session: "ChatSession") -> None:
        if not self.is_running:
            await session.aclose()
            return
        self.session = session
        self.chat.ready(session)
        if session.embedded is not None:
            self.notify(f"No upstream configured: started the {session.upstream_label}.",
                        title="Embedded upstream")
        if session.upstream_problem is not None:
            self.notify(f"{session.upstream_problem}; cached answers still work",
                        title="Upstream unavailable", severity="warning", timeout=15)

    def _failed(self, message: str) -> None:
        if not self.is_running:
            return
        self.chat.failed(message)
        self.notify(message, title="Cannot start", severity="error", timeout=30)

    async def on_unmount(self) -> None:
        if self.session is not None:
            await self.session.aclose()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        if self._chat is None:
            return
        for binding in CHAT_BINDINGS:
            yield SystemCommand(str(binding.description), binding.tooltip,
                                lambda action=binding.action: self.chat.run_action(action))
