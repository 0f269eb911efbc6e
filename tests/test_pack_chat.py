"""The chat's "update the instruction pack" action (Pilot), against a real upstream that
publishes a pack: progress bar, `pack` badge, stats."""

import asyncio
import dataclasses
from pathlib import Path

from meancache.client.config import load_settings
from meancache.client.tui.app import MeanCacheApp
from meancache.shared.encoder import Encoder
from meancache.shared.pack import write_pack
from meancache.upstream.server.app import ServerSettings
from textual.widgets import ProgressBar

from tests.test_chat_app import ask, badge, started, wait_for
from tests.upstream_server import running_upstream

ANSWER = "Boil it for eight minutes."


def test_update_pack_action_then_a_pack_answer(tmp_path: Path, encoder: Encoder,
                                               encoder_cache_dir: Path) -> None:
    published = tmp_path / "published"
    write_pack(published / "p.mcpack", [("How do I boil an egg?", ANSWER)],
               model="builtin:tiny", sigma=3.0)
    data = tmp_path / "data"
    data.mkdir()
    (data / "encoder").symlink_to(encoder_cache_dir, target_is_directory=True)
    base = load_settings(config_dir=tmp_path / "config", data_dir=data, environ={},
                         encoder_model="minilm")

    async def run(url: str) -> None:
        app = MeanCacheApp(dataclasses.replace(base, upstream_url=url, answer_max_tokens=8))
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            notices: list[str] = []
            app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore
            await pilot.press("f6")
            await wait_for(pilot, lambda: any("instructions now answered" in n
                                              for n in notices))
            bar = app.chat.query_one("#progress", ProgressBar)
            size = (published / "p.mcpack").stat().st_size
            assert (bar.progress, bar.total) == (size, size)  # the bar followed the download
            await ask(pilot, "how do i boil an egg")
            turn = app.chat.conversation.turns[-1]
            assert (turn.source, turn.answer) == ("pack", ANSWER)
            assert badge(app).startswith("pack · similarity 1.00")
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "StatsScreen")
            rows = dict(app.screen.rows)  # type: ignore[attr-defined]
            assert "(1 instructions, " in rows["pack version"]
            assert "1 exact + 0 similar hits, 0 rejected" in rows["pack version"]

    with running_upstream(settings=ServerSettings(packs_dir=published)) as url:
        asyncio.run(run(url))
