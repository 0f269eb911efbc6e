"""The stats box shows every value whole: a long one wraps inside the box, and on a short
terminal the box scrolls rather than cutting rows off."""

import asyncio

from meancache.client.tui.screens.stats import StatsScreen
from textual.app import App
from textual.widgets import Static

LONG = ("12 (7 the verifier judged it a different question; 3 several cached questions "
        "were judged the same question; 2 it differs in direction)")
ROWS = [("hit rate", "40.0% (2 hits, 3 misses)"), ("near matches declined", LONG),
        *((f"row {i}", str(i)) for i in range(20))]


def shown_text(widget: Static) -> str:
    """What the widget draws, its lines joined by spaces."""
    lines = widget.render_lines(widget.content_region.reset_offset)
    return " ".join(" ".join(line.text.split()) for line in lines).strip()


def test_a_long_value_wraps_inside_the_box_and_the_box_scrolls() -> None:
    async def run() -> None:
        app: App[None] = App()
        async with app.run_test(size=(90, 20)) as pilot:
            app.push_screen(StatsScreen(ROWS))
            await pilot.pause()
            values = list(app.screen.query(".stat-value").results(Static))
            assert len(values) == len(ROWS)
            long = values[1]
            width = long.content_region.width
            assert 0 < width < len(LONG)  # it does not fit on one line of the box...
            assert long.content_region.height >= -(-len(LONG) // width)  # ...so it wraps
            assert shown_text(long) == LONG  # whole, not cut at the box's edge
            box = app.screen.query_one("VerticalScroll")
            assert box.region.height <= 20 and box.max_scroll_y > 0  # the rest by scrolling

    asyncio.run(run())
