"""The chat view follows a long streamed answer to its end (badge included), unless the
user scrolled up while it came (Pilot, a scripted 60-line answer on loopback)."""

import asyncio
from pathlib import Path

import pytest
from meancache.client.config import Settings
from meancache.client.tui.app import MeanCacheApp
from meancache.client.tui.widgets import AnswerView
from meancache.shared.encoder import Encoder

from tests.support.pilot import ask, chat_settings, started, wait_for
from tests.support.servers import LONG_LINES, scripted_upstream


@pytest.fixture
def settings(tmp_path: Path, encoder: Encoder, device_encoder_dir: Path) -> Settings:
    # the tokens the stub's long answer says it has (an answer past them would be cut)
    return chat_settings(tmp_path, device_encoder_dir, "http://unused.invalid").model_copy(
        update={"answer_max_tokens": 6 * LONG_LINES})


def badge_visible(app: MeanCacheApp, view: AnswerView) -> bool:
    """The badge is drawn whole inside the chat's visible area."""
    region = view.badge.region
    return bool(region.area) and app.chat.messages.region.contains_region(region)


def test_the_view_follows_a_long_answer_to_its_badge(settings: Settings) -> None:
    async def run(url: str) -> None:
        app = MeanCacheApp(settings.model_copy(update=dict(upstream_url=url)))
        async with app.run_test(size=(100, 30)) as pilot:
            await started(pilot)
            await ask(pilot, "List sixty lines.")
            view = app.chat.last_answer()
            assert view is not None
            assert f"Line {LONG_LINES} of" in view.markdown.source
            messages = app.chat.messages
            await wait_for(pilot, lambda: badge_visible(app, view), seconds=5)
            assert messages.max_scroll_y > 2 * LONG_LINES - 30  # far more than one screen
            assert "upstream · first token" in str(view.badge.render())

    with scripted_upstream() as stub:
        asyncio.run(run(f"{stub}/long/v1"))


def test_scrolling_up_while_it_streams_keeps_the_place(settings: Settings) -> None:
    async def run(url: str) -> None:
        app = MeanCacheApp(settings.model_copy(update=dict(upstream_url=url)))
        async with app.run_test(size=(100, 30)) as pilot:
            await started(pilot)
            messages = app.chat.messages
            app.chat.query_one("#question").value = "List sixty lines."  # type: ignore
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.chat.busy and messages.max_scroll_y > 10)
            messages.scroll_home(animate=False)  # the user scrolls up to read the start
            await wait_for(pilot, lambda: bool(app.chat.conversation.turns))
            await wait_for(pilot, lambda: not app.chat.busy)
            await pilot.pause(0.2)
            assert messages.scroll_y < messages.max_scroll_y / 2  # still near the top
            await ask(pilot, "List sixty lines.")  # a new question goes to the end again
            view = app.chat.last_answer()
            assert view is not None
            await wait_for(pilot, lambda: badge_visible(app, view), seconds=5)

    with scripted_upstream() as stub:
        asyncio.run(run(f"{stub}/long/v1"))
