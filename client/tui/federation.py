"""Federated learning in the chat: F7 syncs the newest global model, F8 joins or leaves
rounds (this user's SuperNode) and, while joined, the cache switches to each global model a
round leaves. A widget with nothing to show, so that its workers and its timer live and end
with the chat screen; every blocking call runs in a thread worker."""

import asyncio
from collections.abc import Callable

from meancache.client.chat.global_model import describe_sync, switch_to_latest, sync_and_switch
from meancache.client.chat.session import ChatSession
from meancache.client.fl.participation import FederatedParticipation
from meancache.client.tui.jobs import run_blocking
from meancache.shared.errors import MeanCacheError
from meancache.shared.progress import Progress
from textual import work
from textual.message import Message
from textual.timer import Timer
from textual.widget import Widget


class FederationControl(Widget):
    DEFAULT_CSS = "FederationControl { display: none; }"

    class Changed(Message):
        """Joined, left, or long work ended: the status line shows the new state."""

    def __init__(self, participation: FederatedParticipation,
                 progress: Callable[[str], Progress]) -> None:
        """``progress(label)``: a (done, total) callback for the status line."""
        super().__init__()
        self.participation = participation
        self.progress = progress
        self.session: ChatSession | None = None  # set once the chat session is open
        self._rounds_timer: Timer | None = None

    def describe(self) -> str:
        """The status line's part about federated learning ("" when not joined)."""
        if not self.participation.running:
            return ""
        line = f" · federated learning: joined {self.participation.settings.fl_superlink}"
        if self.participation.known_round is not None:
            line += f" (global model of round {self.participation.known_round})"
        return line

    def _tell(self, message: str, **options: object) -> None:
        """Notify from a worker thread."""
        self.app.call_from_thread(self.notify, message, **options)  # type: ignore[arg-type]

    def _changed(self) -> None:
        self.app.call_from_thread(self.post_message, self.Changed())

    def sync(self) -> None:
        session = self.session
        assert session is not None

        def sync() -> str:
            return describe_sync(*sync_and_switch(
                session, self.progress("downloading the global model…"),
                self.progress("re-embedding cached questions…")))

        run_blocking(self, sync, group="fl", title="Federated model", failed="Sync failed",
                     then=lambda: self.post_message(self.Changed()))

    @work(thread=True, group="fl-join")
    def toggle(self) -> None:
        """Join, or leave when joined; a second press waits for the first to finish."""
        if self.participation.running:
            self.app.call_from_thread(self._stop_watching)
        try:
            joined = self.participation.toggle()
        except (MeanCacheError, OSError) as exc:
            self._tell(str(exc), title="Cannot join federated learning", severity="error")
            return
        self.app.call_from_thread(self._joined if joined else self._left)

    def _joined(self) -> None:
        self._stop_watching()
        self._rounds_timer = self.set_interval(2.0, self.watch_rounds, name="fl-rounds")
        self.notify(f"Joined federated learning at {self.participation.settings.fl_superlink};"
                    " only weights, a threshold and counts leave this device.")
        self.post_message(self.Changed())

    def _left(self) -> None:
        self._stop_watching()
        self.notify("Left federated learning.")
        self.post_message(self.Changed())

    def _stop_watching(self) -> None:
        if self._rounds_timer is not None:
            self._rounds_timer.stop()
            self._rounds_timer = None

    @work(thread=True, exclusive=True, group="fl-watch")
    def watch_rounds(self) -> None:
        """When the SuperNode kept a newer global model, switch the cache to it."""
        new_round = self.participation.poll()
        if self.participation.exit_code is not None and not self.participation.running:
            self.app.call_from_thread(self._stopped_on_its_own)
        elif new_round is not None:
            self._tell(f"Received the global model of round {new_round}; re-embedding.",
                       title="Federated model")
            self.app.call_from_thread(self.switch_model)

    def _stopped_on_its_own(self) -> None:
        self._stop_watching()
        self.notify("The federated learning node stopped; see logs/supernode.log.",
                    severity="warning")
        self.post_message(self.Changed())

    @work(thread=True, exclusive=True, group="fl")
    def switch_model(self) -> None:
        assert self.session is not None
        try:
            switch_to_latest(self.session, self.progress("re-embedding cached questions…"))
        finally:
            self._changed()

    async def on_unmount(self) -> None:
        """Never leave a SuperNode running after the app; stopping it can take seconds,
        so the wait is off the UI thread."""
        self._stop_watching()
        await asyncio.to_thread(self.participation.stop)
