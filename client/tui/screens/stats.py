"""What the caches have done: hit rate, false hits, tokens saved, thresholds, sizes."""

from meancache.client.cache import CacheStats
from meancache.client.chat.session import ChatSession
from meancache.client.tui.packs import describe_pack
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Footer, Label, Static


def stats_rows(stats: CacheStats, pack_version: str | None) -> list[tuple[str, str]]:
    return [*stats.rows, ("pack version", pack_version or "no instruction pack")]


def session_rows(session: ChatSession) -> list[tuple[str, str]]:
    """The rows for the open session. Blocking (the cache's stats take its lock): call it
    from a worker thread."""
    packs = session.answers.packs
    return stats_rows(session.cache.stats(),
                      None if packs is None else describe_pack(packs.stats()))


class StatsScreen(ModalScreen[None]):
    """The statistics as a name column and a value column; a long value (the reasons near
    matches were declined, why no wrong rate is estimated yet) wraps within the box rather
    than being cut at its edge, and the box scrolls on a short terminal."""

    DEFAULT_CSS = """
    StatsScreen { align: center middle; }
    StatsScreen > VerticalScroll { width: 90%; max-width: 100; height: auto;
                                   max-height: 100%; border: round $accent;
                                   background: $surface; padding: 1; }
    StatsScreen Grid { grid-size: 2; grid-columns: 27 1fr; grid-gutter: 0 1;
                       height: auto; margin: 1 0; }
    StatsScreen .stat-name { color: $text-muted; }
    """
    BINDINGS = [Binding("escape", "close", "Close", id="stats.close")]

    def __init__(self, rows: list[tuple[str, str]]) -> None:
        super().__init__()
        self.rows = rows

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Label("Cache statistics")
            with Grid(id="stats-table"):
                for name, value in self.rows:
                    yield Label(name, classes="stat-name")
                    yield Static(value, classes="stat-value", markup=False)
            yield Footer()

    def action_close(self) -> None:
        self.dismiss(None)
