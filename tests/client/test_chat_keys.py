"""Every key in the chat's footer acts or says why it cannot (Pilot, a fresh chat against
a real upstream on loopback); the key table of docs/chat.md lists each one."""

import asyncio
from pathlib import Path

import pytest
from meancache.client.config import Settings
from meancache.client.tui.app import MeanCacheApp
from meancache.shared.encoder import Encoder
from textual.widgets._footer import FooterKey

from tests.support.paths import REPO
from tests.support.pilot import chat_settings, started, wait_for

TABLE_NAMES = {"escape": "esc"}  # how the docs' key table writes a key


@pytest.fixture
def settings(tmp_path: Path, encoder: Encoder, device_encoder_dir: Path,
             upstream_url: str) -> Settings:
    return chat_settings(tmp_path, device_encoder_dir, upstream_url)


def footer_keys(app: MeanCacheApp) -> list[str]:
    return [key.key for key in app.chat.query(FooterKey)]


def test_every_footer_key_acts_or_shows_a_notice(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(200, 50)) as pilot:
            await started(pilot)
            await wait_for(pilot, lambda: bool(footer_keys(app)))
            notices: list[str] = []
            notify = app.notify

            def record(message: str, **options: object) -> None:
                notices.append(message)
                notify(message, **options)  # type: ignore[arg-type]

            app.notify = record  # type: ignore[method-assign]
            keys = footer_keys(app)
            assert {"ctrl+r", "escape", "f6", "f7", "f8", "ctrl+p"} <= set(keys), keys
            for key in keys:
                before, screen = len(notices), app.screen
                await pilot.press(key)
                await wait_for(pilot, lambda b=before, s=screen: len(notices) > b  # type: ignore
                               or app.screen is not s)
                if app.screen is not screen:  # it opened a screen: close it again
                    await pilot.press("escape")
                    await wait_for(pilot, lambda: app.screen is app.chat)
                await wait_for(pilot, lambda: not any(w.is_running for w in app.chat.workers))
            said = "\n".join(notices)
            assert "nothing to reject: this answer came from the model" not in said  # no turn
            assert "nothing to reject: no answer yet" in said
            assert "nothing to stop" in said and "fl_server_url" in said \
                and "fl_superlink" in said

    asyncio.run(run())


def test_ctrl_c_says_how_to_quit_in_plain_words(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("ctrl+c")
            await wait_for(pilot, lambda: bool(app._notifications))
            [notice] = list(app._notifications)
            assert notice.message == "Press ctrl+q to quit the app"
            assert not notice.markup

    asyncio.run(run())


def test_the_docs_key_table_lists_every_footer_key(settings: Settings) -> None:
    table = (REPO / "docs" / "chat.md").read_text()

    async def run() -> list[str]:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(200, 50)) as pilot:
            await started(pilot)
            await wait_for(pilot, lambda: bool(footer_keys(app)))
            return footer_keys(app)

    for key in asyncio.run(run()):
        assert f"\n| {TABLE_NAMES.get(key, key)} |" in table, key
