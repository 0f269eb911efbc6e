"""The chat's "update the instruction pack" action (Pilot), against a real upstream that
publishes a pack: progress bar, `pack` badge, stats."""

import asyncio
import dataclasses
from pathlib import Path

from meancache.client.config import Settings, load_settings
from meancache.client.tui.app import MeanCacheApp
from meancache.shared.encoder import Encoder
from meancache.shared.pack import write_pack
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.serve import BackgroundServer, private_settings

from tests.support.paths import data_dir_linking
from tests.support.pilot import ask, badge, started, wait_for
from tests.support.servers import running_upstream

ANSWER = "Boil it for eight minutes."


def publish_and_prepare(tmp_path: Path, device_encoder_dir: Path) -> tuple[Path, Settings]:
    """A published pack, and settings whose data dir reuses the session's encoder."""
    published = tmp_path / "published"
    write_pack(published / "p.mcpack", [("How do I boil an egg?", ANSWER)],
               model="builtin:tiny", sigma=3.0)
    data = data_dir_linking(tmp_path / "data", device_encoder_dir)
    return published, load_settings(config_dir=tmp_path / "config", data_dir=data,
                                    environ={}, encoder_model="minilm")


def test_update_pack_action_then_a_pack_answer(tmp_path: Path, encoder: Encoder,
                                               device_encoder_dir: Path) -> None:
    published, base = publish_and_prepare(tmp_path, device_encoder_dir)

    async def run(url: str) -> None:
        app = MeanCacheApp(base.model_copy(update=dict(upstream_url=url, answer_max_tokens=8)))
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            notices: list[str] = []
            app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore
            # What the bar showed for the download: the pack's embedding, which follows in
            # the background, shows in the same bar, so its last state is not the download's.
            line, shown = app.chat.status_line, []
            work = line.work
            line.work = lambda label, done, total: (  # type: ignore[method-assign]
                shown.append((done, total)) if "downloading" in label else None,
                work(label, done, total))
            await pilot.press("f6")
            await wait_for(pilot, lambda: any("instructions now answered" in n
                                              for n in notices))
            size = (published / "p.mcpack").stat().st_size
            assert shown and shown[-1] == (size, size)  # the bar followed the download
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


def test_the_pack_action_sends_the_embedded_upstreams_own_key(
        tmp_path: Path, encoder: Encoder, device_encoder_dir: Path) -> None:
    """The embedded upstream's key is made at its start: the pack download sends it (no
    configured key would be accepted)."""
    published, base = publish_and_prepare(tmp_path, device_encoder_dir)
    servers: list[BackgroundServer] = []

    def start_upstream(model: str, data_dir: Path, progress: object) -> BackgroundServer:
        settings = dataclasses.replace(private_settings(), packs_dir=published)
        servers.append(BackgroundServer(model, settings, data_dir=data_dir).start())
        return servers[-1]

    async def run() -> None:
        app = MeanCacheApp(base.model_copy(update=dict(upstream_model="builtin:tiny",
                                               upstream_api_key="a-configured-key",
                                               answer_max_tokens=8)), start_upstream)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            notices: list[str] = []
            app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore
            await pilot.press("f6")
            await wait_for(pilot, lambda: bool(notices))
            assert "1 instructions now answered" in notices[0], notices
            await ask(pilot, "how do i boil an egg")
            assert app.chat.conversation.turns[-1].source == "pack"

    asyncio.run(run())
    assert servers and servers[0].api_key not in (None, "a-configured-key")
