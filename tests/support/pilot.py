"""Driving the chat app with Textual's Pilot: wait on a condition, never a sleep."""

from collections.abc import Callable
from pathlib import Path

from meancache.client.config import Settings, load_settings
from meancache.client.tui.app import MeanCacheApp
from textual.pilot import Pilot

from tests.support.paths import data_dir_linking


def chat_settings(tmp_path: Path, device_encoder_dir: Path, upstream_url: str) -> Settings:
    """A fresh data dir under ``tmp_path`` (the session's device encoder linked in), the
    packaged MiniLM, the upstream at ``upstream_url``, short answers, and no exploration
    (a test of hits must not draw; tests of exploration set ``explore_rate``)."""
    data = data_dir_linking(tmp_path / "data", device_encoder_dir)
    base = load_settings(config_dir=tmp_path / "config", data_dir=data, environ={},
                         encoder_model="minilm")
    return base.model_copy(update=dict(upstream_url=upstream_url, answer_max_tokens=24,
                                       tune_min_per_class=1, explore_rate=0.0))


async def wait_for(pilot: Pilot, condition: Callable[[], bool], seconds: float = 30) -> None:
    for _ in range(int(seconds * 20)):
        if condition():
            return
        await pilot.pause(0.05)
    raise AssertionError("timed out waiting for the app")


async def started(pilot: Pilot) -> MeanCacheApp:
    app = pilot.app
    assert isinstance(app, MeanCacheApp)
    await wait_for(pilot, lambda: app.session is not None)
    return app


async def ask(pilot: Pilot, question: str) -> None:
    app = pilot.app
    assert isinstance(app, MeanCacheApp)
    count = len(app.chat.conversation.turns)
    pilot.app.chat.query_one("#question").value = question  # type: ignore[attr-defined]
    await pilot.press("enter")
    await wait_for(pilot, lambda: len(app.chat.conversation.turns) > count
                   or ("no answer" in str(app.chat.last_answer().badge.render())
                       if app.chat.last_answer() else False))
    await wait_for(pilot, lambda: not app.chat.busy)


def badge(app: MeanCacheApp) -> str:
    view = app.chat.last_answer()
    assert view is not None
    return str(view.badge.render())
