"""The chat app driven by Textual's Pilot against a real upstream on loopback."""

import asyncio
import threading
import tomllib
from collections.abc import Callable
from pathlib import Path

import pytest
from meancache.client.cache import SemanticCache
from meancache.client.chat.conversations import Conversation
from meancache.client.config import Settings
from meancache.client.errors import CacheAccessError, RejectionError
from meancache.client.tui.app import MeanCacheApp
from meancache.client.tui.widgets import AnswerView
from meancache.shared.encoder import Encoder
from meancache.shared.fl.app_signing import operator_key
from meancache.upstream.server.serve import BackgroundServer
from textual.widgets._toast import Toast

from meancache.embedded import start_embedded_upstream
from tests.support.pilot import ask, badge, chat_settings, started, wait_for
from tests.support.servers import free_port, scripted_upstream, serving


@pytest.fixture
def settings(tmp_path: Path, encoder: Encoder, device_encoder_dir: Path,
             upstream_url: str) -> Settings:
    return chat_settings(tmp_path, device_encoder_dir, upstream_url)


def test_miss_then_repeat_then_paraphrase(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "How do I reverse a list in Python?")
            first = app.chat.conversation.turns[-1]
            assert first.source == "upstream" and first.answer
            assert badge(app).startswith("upstream · first token")
            shown = app.chat.last_answer()
            assert shown is not None and shown.markdown.source  # streamed text is on screen

            await ask(pilot, "How do I reverse a list in Python?")
            repeat = app.chat.conversation.turns[-1]
            assert repeat.source == "cache" and repeat.answer == first.answer
            assert "cache · similarity 1.00" in badge(app)

            await ask(pilot, "How can I reverse a Python list?")
            paraphrase = app.chat.conversation.turns[-1]
            assert paraphrase.source == "cache"
            assert paraphrase.matched_query == "How do I reverse a list in Python?"
            assert "matched “How do I reverse a list in Python?”" in badge(app)
        stored = app.session.conversations.list() if app.session else []
        assert stored and len(stored[0].turns) == 3

    asyncio.run(run())


def test_reject_requeries_and_retunes(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "What is the capital of France?")
            answered = badge(app)
            await pilot.press("ctrl+r")  # an upstream answer: nothing cached to reject
            await pilot.pause()
            assert not app.chat.busy and badge(app) == answered
            assert app.chat.conversation.turns[-1].replaced is None
            await ask(pilot, "What's the capital of France?")  # a hit: a weak positive
            assert app.chat.conversation.turns[-1].source == "cache"
            await ask(pilot, "Name the capital of France.")
            wrong = app.chat.conversation.turns[-1]
            assert wrong.source == "cache"
            notices: list[str] = []
            app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: app.chat.conversation.turns[-1].source == "upstream")
            await wait_for(pilot, lambda: not app.chat.busy)
            fixed = app.chat.conversation.turns[-1]
            assert fixed.replaced == wrong.answer
            assert "replaced a rejected cached answer" in badge(app)
            assert app.session is not None
            threshold = app.session.cache.threshold
            assert threshold > (wrong.similarity or 0)  # the false hit would now miss
            assert any("->" in n for n in notices), notices
            assert app.session.cache.stats().rejections == 1

    asyncio.run(run())


def test_follow_up_in_another_context_is_not_served_from_cache(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "What is the capital of France?")
            await ask(pilot, "What famous landmark can you find there?")
            await pilot.press("ctrl+n")
            await ask(pilot, "What is the capital of Italy?")
            await ask(pilot, "What famous landmark can you find there?")
            assert app.chat.conversation.turns[-1].source == "upstream"
            await pilot.press("ctrl+n")
            await ask(pilot, "What is the capital of France?")
            await ask(pilot, "What famous landmark can you find there?")
            assert app.chat.conversation.turns[-1].source == "cache"  # same context: a hit

    asyncio.run(run())


def test_a_first_turn_is_not_served_to_the_same_words_inside_another_conversation(
        settings: Settings) -> None:
    """The issue's scenario: "What about Germany?" asked first is cached as a first turn;
    asked after "What is the capital of France?" it asks something else: the upstream
    answers. Asked first again, the cache does."""
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "What about Germany?")
            await pilot.press("ctrl+n")
            await ask(pilot, "What is the capital of France?")
            await ask(pilot, "What about Germany?")
            assert app.chat.conversation.turns[-1].source == "upstream"
            await pilot.press("ctrl+n")
            await ask(pilot, "What about Germany?")
            assert app.chat.conversation.turns[-1].source == "cache"

    asyncio.run(run())


@pytest.fixture
def down(settings: Settings, encoder: Encoder) -> Settings:
    """Settings whose upstream is down (nothing listens), with one answer in the cache."""
    with SemanticCache(settings.cache_dir, encoder, settings.cache_settings()) as cache:
        cache.insert("How do I boil an egg?", "Simmer it for nine minutes.")
    return settings.model_copy(update=dict(upstream_url=f"http://127.0.0.1:{free_port()}"))


def test_upstream_down_still_serves_cached_answers(down: Settings) -> None:

    async def run() -> None:
        app = MeanCacheApp(down)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "How do I boil an egg?")
            assert app.chat.conversation.turns[-1].answer == "Simmer it for nine minutes."
            await ask(pilot, "Who painted the Mona Lisa?")
            assert "no answer: cannot reach the upstream" in badge(app)
            assert len(app.chat.conversation.turns) == 1  # the failed question left no turn

    asyncio.run(run())


def test_the_status_line_says_whether_the_upstream_answers_as_last_found(
        settings: Settings) -> None:
    """Down at start, then up, then down again: the status line follows, not the start."""
    server = BackgroundServer("builtin:tiny")  # its port bound, nothing listening yet
    up = settings.model_copy(update=dict(upstream_url=server.url))

    def status(app: MeanCacheApp) -> str:
        return str(app.chat.query_one("#status").render())

    async def run() -> None:
        app = MeanCacheApp(up)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            assert status(app) == f"upstream {server.url} (unreachable)"
            server.start()
            try:
                await ask(pilot, "Who painted the Mona Lisa?")
                assert app.chat.conversation.turns[-1].source == "upstream"
                assert status(app) == f"upstream {server.url}"
            finally:
                server.stop()
            await ask(pilot, "Who wrote Hamlet?")
            assert "no answer: cannot reach the upstream" in badge(app)
            assert status(app) == f"upstream {server.url} (unreachable)"

    asyncio.run(run())


def test_an_empty_answer_is_shown_with_its_reason_and_can_be_rejected(
        settings: Settings) -> None:
    async def run(url: str) -> None:
        app = MeanCacheApp(settings.model_copy(update=dict(upstream_url=url)))
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            assert app.chat.query_one("#status").render().plain == f"upstream {url} · scripted"
            await ask(pilot, "How do I boil an egg?")
            view = app.chat.last_answer()
            assert view is not None
            assert view.markdown.source == "(empty answer; the server stopped: stop)"
            assert app.chat.check_action("reject", ()) is True
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: app.chat.conversation.turns[-1].replaced is not None)
            await wait_for(pilot, lambda: not app.chat.busy)
            assert "replaced an empty answer" in badge(app)
            assert len(app.session.cache) == 0  # type: ignore[union-attr]

    with scripted_upstream() as stub:
        asyncio.run(run(f"{stub}/empty/v1"))


def test_attached_document_reports_reused_tokens(settings: Settings, tmp_path: Path) -> None:
    document = tmp_path / "manual.txt"
    document.write_text("To fit the saddle, loosen the clamp with a 5 mm hex key.\n" * 5)

    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("ctrl+l")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "AttachScreen")
            app.screen.query_one("#attach-path").value = str(document)  # type: ignore
            await pilot.press("enter")
            await wait_for(pilot, lambda: bool(app.chat.conversation.documents))
            await ask(pilot, "Which key fits the saddle?")  # computes the document once
            await ask(pilot, "And the seat post?")  # reads it back
            turn = app.chat.conversation.turns[-1]
            assert turn.source == "upstream"
            assert turn.cached_tokens >= len(document.read_text()) // 2
            assert f"{turn.cached_tokens} prompt tokens reused" in badge(app)

    asyncio.run(run())


def test_without_an_upstream_it_starts_the_embedded_one(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings.model_copy(update=dict(upstream_url=None,
                                                           upstream_model="builtin:tiny")),
                           start_embedded_upstream)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            status = str(app.chat.query_one("#status").render())
            assert "embedded upstream: builtin:tiny (untrained demo model)" in status
            await ask(pilot, "hello")
            assert app.chat.conversation.turns[-1].source == "upstream"

    asyncio.run(run())


def test_the_embedded_demo_models_answers_are_not_labels(settings: Settings) -> None:
    """With the embedded demo model as upstream the cache does not learn from its answers
    (``learn_from_answers`` unset): a would-be hit is served even with every near one to
    be explored, nothing is labelled, and the stats screen says where labels come from."""
    exploring = settings.model_copy(update=dict(
        upstream_url=None, upstream_model="builtin:tiny", explore_rate=1.0,
        explore_width=1.0))

    async def run() -> None:
        app = MeanCacheApp(exploring, start_embedded_upstream)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "How do I reverse a list in Python?")
            await ask(pilot, "How can I reverse a Python list?")
            assert app.chat.conversation.turns[-1].source == "cache"
            assert app.session.cache.learned.labels == []  # type: ignore[union-attr]
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "StatsScreen")
            rows = dict(app.screen.rows)  # type: ignore[attr-defined]
            assert rows["labels from"].startswith("'wrong answer' only")
            assert rows["hit rate"] == "50.0% (1 hit, 1 miss)"

    asyncio.run(run())


def test_stats_conversations_and_export(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "How far is the moon?")
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "StatsScreen")
            rows = dict(app.screen.rows)  # type: ignore[attr-defined]
            assert rows["entries"] == "1"
            assert rows["similarity threshold (tau)"] == f"{settings.global_threshold:.3f}"
            await pilot.press("escape")
            await pilot.press("ctrl+s")
            exported = settings.data_dir / "exports" / f"chat-{app.chat.conversation.id}.md"
            await wait_for(pilot, exported.exists)
            assert "How far is the moon?" in exported.read_text()
            first_id = app.chat.conversation.id
            await pilot.press("ctrl+n")
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                           "ConversationsScreen")
            await pilot.press("enter")
            await wait_for(pilot, lambda: app.chat.conversation.id == first_id)
            assert len(list(app.chat.query(AnswerView))) == 1
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                           "ConversationsScreen")
            await pilot.press("d")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                           "ConfirmDeleteScreen")
            await pilot.press("k")  # the chat goes, its cached answer stays
            await wait_for(pilot, lambda: not app.session.conversations.list())  # type: ignore
            assert len(app.session.cache) == 1  # type: ignore[union-attr]

    asyncio.run(run())


def test_deleting_a_chat_asks_first_and_can_drop_its_cache_entries(
    settings: Settings
) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            session = (await started(pilot)).session
            assert session is not None
            await ask(pilot, "How far is the moon?")
            await ask(pilot, "How far is the moon?")  # served from the cache: not its own
            await pilot.press("ctrl+n")
            await ask(pilot, "Why is the sky blue?")
            assert len(session.cache) == 2

            async def choose_delete() -> None:
                await pilot.press("ctrl+o")
                await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                               "ConversationsScreen")
                await pilot.press("d")  # the newest chat comes first
                await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                               "ConfirmDeleteScreen")

            await choose_delete()
            await pilot.press("n")  # cancelled: nothing is deleted
            await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                           "ConversationsScreen")
            assert len(session.conversations.list()) == 2 and len(session.cache) == 2
            await pilot.press("escape")
            await choose_delete()
            await pilot.press("y")
            await wait_for(pilot, lambda: len(session.conversations.list()) == 1)
            remaining = [e.query for e in session.cache.entries()]
            assert remaining == ["How far is the moon?"]

    asyncio.run(run())


def test_keymap_remaps_a_binding_by_id(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings.model_copy(update=dict(keymap={"stats": "f5"})))
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await pilot.press("ctrl+t")  # the default key no longer opens the stats
            await pilot.pause()
            assert app.screen is app.chat
            await pilot.press("f5")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "StatsScreen")
            assert dict(app.screen.rows)["entries"] == "0"  # type: ignore[attr-defined]

    asyncio.run(run())


def test_multi_line_paste_and_an_over_long_question(settings: Settings) -> None:
    from textual.events import Paste

    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(80, 24)) as pilot:
            await started(pilot)
            box = app.chat.query_one("#question")
            box.post_message(Paste("first line\nsecond line\n\nthird"))
            await wait_for(pilot, lambda: bool(box.value))  # type: ignore[attr-defined]
            assert box.value == "first line second line third"  # type: ignore[attr-defined]
            await pilot.press("enter")
            await wait_for(pilot, lambda: len(app.chat.conversation.turns) == 1)
            await pilot.resize_terminal(50, 20)
            long_question = "why " * 400  # past MiniLM's 256-token window
            await ask(pilot, long_question)
            turn = app.chat.conversation.turns[-1]
            assert turn.truncated
            assert "question truncated for matching" in badge(app)

    asyncio.run(run())


def test_fl_actions_are_off_until_configured(settings: Settings) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            status = str(app.chat.query_one("#status").render())
            await pilot.press("f7", "f8")
            await pilot.pause()
            assert not app.chat.workers  # neither a sync nor a join started
            assert not app.chat.federation.running
            assert str(app.chat.query_one("#status").render()) == status

    asyncio.run(run())


def test_sync_downloads_the_global_model_and_re_embeds(
    settings: Settings, torch_encoder: Encoder, tmp_path: Path
) -> None:
    from functools import partial

    from meancache.fl_server.model_endpoint import create_model_app
    from meancache.shared.fl.checkpoint import save_checkpoint
    from meancache.shared.fl.signing import PUBLIC_KEY, server_key, sign
    from meancache.shared.fl.weights import federated_names, federated_state

    model = torch_encoder.sentence_transformer
    names = federated_names(model, 1)
    nudged = {k: v * 1.01 for k, v in federated_state(model, names).items()}
    save_checkpoint(tmp_path / "server", 4, nudged, 0.88, torch_encoder.base_version, 1,
                    sign=partial(sign, key=server_key(tmp_path / "server")))


    async def run(url: str) -> None:
        app = MeanCacheApp(settings.model_copy(update=dict(
            fl_server_url=url, encoder_backend="torch",
            fl_server_public_key=str(tmp_path / "server" / PUBLIC_KEY))))
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "How do I learn to swim?")
            assert app.session is not None
            before = app.session.cache.encoder.version
            await pilot.press("f7")
            await wait_for(pilot, lambda: app.session.cache.encoder.version != before, 120)
            await wait_for(pilot, lambda: not app.chat.workers, 60)
            stats = app.session.cache.stats()
            assert stats.entries == 1 and stats.stale_entries == 0
            assert stats.global_threshold == pytest.approx(0.88)
            await ask(pilot, "How do I learn to swim?")
            assert app.chat.conversation.turns[-1].source == "cache"

    with serving(create_model_app(tmp_path / "server")) as url:
        asyncio.run(run(url))


def rounds_timer_running() -> bool:
    return any(task.get_name() == "fl-rounds" and not task.done()
               for task in asyncio.all_tasks())


def test_join_and_leave_leave_no_process_and_no_timer(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # Nothing listens on the SuperLink port: the SuperNode starts and keeps retrying.
    operator_key(settings.data_dir / "operator" / "app-signing-key")
    configured = settings.model_copy(update=dict(
        fl_superlink=f"127.0.0.1:{free_port()}",
        fl_app_public_key=str(settings.data_dir / "operator" / "app-signing-key.pub")))

    async def run() -> None:
        app = MeanCacheApp(configured)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            stops = record_threads(monkeypatch, app.chat.federation, "stop")
            status = app.chat.query_one("#status")
            await pilot.press("f8")
            await wait_for(pilot, lambda: "federated learning: joined" in str(status.render()))
            node = app.chat.federation.process
            assert node is not None and node.poll() is None
            args = list(node.args)  # type: ignore[arg-type]
            node_config = Path(args[args.index("--node-config") + 1])
            assert tomllib.loads(node_config.read_text()) == {"data-dir": str(configured.data_dir)}
            assert "--trusted-entities" in args  # the node runs only operator-signed apps
            assert rounds_timer_running()
            await pilot.press("f8")
            await wait_for(pilot, lambda: "federated learning" not in str(status.render()))
            assert node.poll() is not None  # terminated and waited for
            await wait_for(pilot, lambda: not rounds_timer_running())

            await pilot.press("f8", "f8")  # a quick double press joins, then leaves
            await wait_for(pilot, lambda: not app.chat.workers)
            assert not app.chat.federation.running and not rounds_timer_running()

            await pilot.press("f8")  # joined again, then the app quits without leaving
            await wait_for(pilot, lambda: app.chat.federation.running)
            node = app.chat.federation.process
        assert node is not None and node.poll() is not None
        assert not rounds_timer_running()
        # stopping a node waits up to 10 s: never on the UI thread, leaving or quitting
        assert stops and threading.main_thread() not in stops

    asyncio.run(run())


def test_server_text_is_shown_as_plain_text(settings: Settings) -> None:
    """An upstream's error message with Rich markup in it is shown character for
    character (and cannot break the app with an unbalanced tag)."""
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route


    hostile = "[bold red]click[/] [link=http://203.0.113.9]here[/link] [/oops]"

    async def models(request: object) -> JSONResponse:  # the start check passes
        return JSONResponse({"object": "list", "data": [{"id": "m", "object": "model"}]})

    async def refuse(request: object) -> JSONResponse:
        return JSONResponse({"error": {"message": hostile}}, status_code=400)

    server = Starlette(routes=[Route("/v1/models", models, methods=["GET"]),
                               Route("/v1/{rest:path}", refuse, methods=["POST"])])

    async def run(url: str) -> None:
        app = MeanCacheApp(settings.model_copy(update=dict(upstream_url=url)))
        async with app.run_test(size=(120, 40), notifications=True) as pilot:
            await started(pilot)
            await ask(pilot, "How far is the moon?")
            await wait_for(pilot, lambda: any(hostile in str(toast.render())
                                              for toast in app.screen.query(Toast)))
            assert hostile in badge(app)

    with serving(server) as url:
        asyncio.run(run(url))


def test_wrong_answer_while_the_upstream_is_down_keeps_the_app_up(down: Settings) -> None:

    async def run() -> None:
        app = MeanCacheApp(down)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "How do I boil an egg?")
            assert app.chat.conversation.turns[-1].source == "cache"
            notices: list[str] = []
            app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: "the upstream could not answer" in badge(app))
            await wait_for(pilot, lambda: not app.chat.busy)
            assert any("cannot reach the upstream" in n for n in notices), notices
            assert app.is_running and app.screen is app.chat

    asyncio.run(run())


def fail_with(error: Exception) -> Callable[..., object]:
    def fail(*args: object, **kwargs: object) -> object:
        raise error
    return fail


@pytest.mark.parametrize("part, error", [
    ("cache", CacheAccessError("cannot write the cache in /nowhere: read-only file system")),
    ("answers", RejectionError("only an answer served from a cache, or an empty one, can "
                               "be marked wrong")),
])
def test_a_failing_wrong_answer_shows_a_notice_and_keeps_the_app_up(
        settings: Settings, part: str, error: Exception) -> None:
    """Faults a real cache cannot raise on demand are injected in the reject path."""
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            session = (await started(pilot)).session
            assert session is not None
            await ask(pilot, "What is the capital of France?")
            await ask(pilot, "What is the capital of France?")
            assert app.chat.conversation.turns[-1].source == "cache"
            target = session.cache if part == "cache" else session.answers
            target.reject = fail_with(error)  # type: ignore[method-assign]
            notices: list[str] = []
            app.notify = lambda message, **kw: notices.append(str(message))  # type: ignore
            await pilot.press("ctrl+r")
            await wait_for(pilot, lambda: bool(notices))
            await wait_for(pilot, lambda: not app.chat.busy)
            assert notices == [str(error)]  # one line, the error's own words
            assert app.is_running and app.screen is app.chat
            await ask(pilot, "Why is the sky blue?")  # the chat goes on
            assert app.chat.conversation.turns[-1].question == "Why is the sky blue?"

    asyncio.run(run())


def record_threads(monkeypatch: pytest.MonkeyPatch, owner: object, name: str
                   ) -> list[threading.Thread]:
    """Spy on a real method: the threads it ran on (the real method still runs)."""
    threads: list[threading.Thread] = []
    original = getattr(owner, name)

    def spy(*args: object, **kwargs: object) -> object:
        threads.append(threading.current_thread())
        return original(*args, **kwargs)

    monkeypatch.setattr(owner, name, spy)
    return threads


def test_stats_export_listing_and_deletion_run_off_the_ui_thread(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(120, 40)) as pilot:
            session = (await started(pilot)).session
            assert session is not None
            ui = threading.current_thread()
            stats = record_threads(monkeypatch, session.cache, "stats")
            export = record_threads(monkeypatch, Conversation, "to_markdown")
            listing = record_threads(monkeypatch, session.conversations, "list")
            deletion = record_threads(monkeypatch, session.conversations, "delete")
            await ask(pilot, "How far is the moon?")
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "StatsScreen")
            await pilot.press("escape")
            await wait_for(pilot, lambda: app.screen is app.chat)
            await pilot.press("ctrl+s")
            exported = settings.data_dir / "exports" / f"chat-{app.chat.conversation.id}.md"
            await wait_for(pilot, exported.exists)
            exported.unlink()
            await pilot.press("ctrl+o")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                           "ConversationsScreen")
            await pilot.press("e")  # the same export, from the list of chats
            await wait_for(pilot, exported.exists)
            assert len(export) == 2
            await pilot.press("d")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                           "ConfirmDeleteScreen")
            await pilot.press("k")
            await wait_for(pilot, lambda: bool(deletion))
            await wait_for(pilot, lambda: app.screen.__class__.__name__ ==
                           "ConversationsScreen")
            for name, threads in [("stats", stats), ("export", export),
                                  ("listing", listing), ("deletion", deletion)]:
                assert threads and ui not in threads, name

    asyncio.run(run())


def test_exploration_shows_the_fresh_answer_labels_the_pair_and_counts_it(
        settings: Settings) -> None:
    """With every near would-be hit explored (rate 1: deterministic), the paraphrase that
    would be served gets the upstream's fresh answer, its badge says the match was
    checked, the pair becomes a label and the stats screen counts the exploration."""
    exploring = settings.model_copy(update=dict(explore_rate=1.0, explore_width=1.0))

    async def run() -> None:
        app = MeanCacheApp(exploring)
        async with app.run_test(size=(120, 40)) as pilot:
            await started(pilot)
            await ask(pilot, "How do I reverse a list in Python?")
            await ask(pilot, "How can I reverse a Python list?")
            checked = app.chat.conversation.turns[-1]
            assert checked.source == "upstream" and checked.answer
            assert "cache match" in badge(app) and "checked" in badge(app)
            assert "exploration" in badge(app)
            cache = app.session.cache  # type: ignore[union-attr]
            [label] = cache.learned.labels
            assert (label.source, label.labelled_with) == ("explore", 1.0)
            await ask(pilot, "How do I reverse a list in Python?")  # the very same question
            assert app.chat.conversation.turns[-1].source == "cache"
            await pilot.press("ctrl+t")
            await wait_for(pilot, lambda: app.screen.__class__.__name__ == "StatsScreen")
            rows = dict(app.screen.rows)  # type: ignore[attr-defined]
            assert rows["hit rate"] == "33.3% (1 hit, 2 misses, 1 of them explored)"
            assert "1 labels" in rows["wrong answers (estimated)"]
            bound = cache.learned.bound  # the row names the score the bound serves from
            assert rows["served from (judge's score)"] == (
                "none: only repeats and confirmed rewordings (see wrong answers)"
                if bound.closed else f"{bound.threshold:.3f}")

    asyncio.run(run())
