"""Driving the chat app with Textual's Pilot: wait on a condition, never a sleep."""

from collections.abc import Callable

from meancache.client.tui.app import MeanCacheApp
from textual.pilot import Pilot


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
