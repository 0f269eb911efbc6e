"""The chat's start, inside the app: each step named and numbered on the status line, with
its time so far (Pilot, the embedded upstream on builtin:tiny)."""

import asyncio
import threading
import time
from pathlib import Path

import httpx
import pytest
from meancache.client.chat.session import ChatSession, EmbeddedUpstream, UpstreamStarter
from meancache.client.chat.steps import LOADING, startup_steps
from meancache.client.config import Settings, with_upstream
from meancache.client.fl.participation import FederatedParticipation
from meancache.client.tui.app import MeanCacheApp
from meancache.client.tui.screens.chat import ChatScreen
from meancache.client.tui.screens.start import StartScreen
from meancache.client.tui.start_steps import StartSteps
from meancache.client.tui.widgets import AnswerView, StatusLine
from meancache.shared.encoder import Encoder
from meancache.shared.errors import MeanCacheError
from meancache.shared.progress import Progress
from textual.events import Key
from textual.pilot import Pilot
from textual.widgets import Input, Static

from meancache.embedded import start_embedded_upstream
from tests.support.pilot import ask, chat_settings, started, wait_for


@pytest.fixture
def settings(tmp_path: Path, encoder: Encoder, device_encoder_dir: Path) -> Settings:
    return chat_settings(tmp_path, device_encoder_dir, "").model_copy(
        update=dict(upstream_url=None, upstream_model="builtin:tiny"))


def test_the_start_names_each_step_in_the_app(settings: Settings,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[str] = []
    show = StatusLine.show
    monkeypatch.setattr(StatusLine, "show",
                        lambda self, text: (shown.append(text), show(self, text))[1])
    steps = startup_steps(settings)
    assert len(steps) == 5 and steps[-1].startswith("starting the language model")
    assert steps[0] == LOADING  # the program's heavy parts load inside the app too

    async def run() -> None:
        app = MeanCacheApp(settings, start_embedded_upstream)
        async with app.run_test(size=(160, 40)) as pilot:
            await started(pilot)
            assert "embedded upstream: builtin:tiny" in shown[-1]

    asyncio.run(run())
    numbered = [line for line in shown if line.startswith("step ")]
    began = list(dict.fromkeys(line.split(": ", 1)[1].split("…")[0] for line in numbered))
    # every step of the session's opening, in order, named (loading the program is too, but
    # here it is done before the first frame: this process has imported it already)
    assert [step for step in steps if step in began] == began
    assert set(steps[1:]) <= set(began)
    assert all(line.split("… ")[1].split(" s")[0].isdigit() for line in numbered)


def test_a_step_with_progress_says_its_share_and_an_estimate() -> None:
    start = StartSteps(["assembling the encoder"])
    start.begin("assembling the encoder")
    start.began = start.part_began = time.monotonic() - 10  # ten seconds in
    start.progress(25, 100)
    start.part_began = time.monotonic() - 10
    line = start.line()
    assert line is not None and line.startswith("step 1 of 1: assembling the encoder… 10 s")
    left = float(line.split("about ")[1].split(" s left")[0])
    assert 29 <= left <= 31  # a quarter in 10 s: about 30 s more
    start.progress(10, 400)  # a new part (its total changed): its estimate starts anew
    assert "about" not in (start.line() or "")
    start.end()
    assert start.line() is None


def welcome_text(app: MeanCacheApp) -> str:
    return str(app.chat.query_one(".welcome", Static).render())


def test_the_empty_chat_says_the_embedded_demo_model_answers_roughly(
        settings: Settings) -> None:
    """The default: no upstream named, the embedded Gemma 3 270M. The text comes from the
    settings and shows while the chat starts; started here without an upstream starter,
    the start stops at once after drawing the chat, so no model is loaded."""
    default = settings.model_copy(update={"upstream_model": None})

    async def run() -> None:
        app = MeanCacheApp(default)
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_for(pilot, lambda: app._chat is not None and bool(
                app.chat.query(".welcome")))
            text = welcome_text(app)
            assert "builtin:gemma-3-270m" in text and "small offline" in text
            assert "demo model" in text and "rough" in text
            assert "--upstream URL" in text and "OPENAI_BASE_URL" in text

    asyncio.run(run())


def test_the_empty_chat_names_an_external_upstream_and_comes_back_with_a_new_chat(
        settings: Settings, upstream_url: str) -> None:
    external = with_upstream(settings.model_copy(update={"upstream_model": None}),
                             environ={"OPENAI_BASE_URL": upstream_url})

    async def run() -> None:
        app = MeanCacheApp(external)
        async with app.run_test(size=(160, 40)) as pilot:
            await started(pilot)
            text = welcome_text(app)
            assert f"the upstream at {upstream_url} (the first model it lists)" in text
            assert "demo model" not in text and "rough" not in text
            assert "--upstream URL" in text and "OPENAI_BASE_URL" in text
            await ask(pilot, "hello")
            await pilot.press("ctrl+n")
            await wait_for(pilot, lambda: not app.chat.query(AnswerView))
            assert welcome_text(app) == text

    asyncio.run(run())


def held_start(release: threading.Event, fails: bool = False) -> UpstreamStarter:
    """The embedded upstream's start, held until ``release`` is set (then failing, with
    ``fails``): the window in which a user types before the chat can answer."""
    def start(model: str, data_dir: Path, progress: Progress | None) -> EmbeddedUpstream:
        assert release.wait(60), "the test never released the start"
        if fails:
            raise MeanCacheError("the model could not be loaded")
        return start_embedded_upstream(model, data_dir, progress)
    return start


async def send_while_starting(pilot: Pilot, app: MeanCacheApp, text: str) -> Input:
    await wait_for(pilot, lambda: app._chat is not None and bool(app.chat.query("#question")))
    question = app.chat.query_one("#question", Input)
    await wait_for(pilot, lambda: question.has_focus)  # it takes keys from the first frame
    await pilot.press(*text)
    await pilot.press("enter")
    assert app.session is None  # still starting
    return question


def test_a_question_sent_while_it_starts_is_asked_once_it_is_ready(
        settings: Settings) -> None:
    release = threading.Event()

    async def run() -> None:
        app = MeanCacheApp(settings, held_start(release))
        async with app.run_test(size=(160, 40)) as pilot:
            try:
                question = await send_while_starting(pilot, app, "hi there")
                assert question.value == ""  # taken, to be asked
                await send_while_starting(pilot, app, "and this")
                assert question.value == "and this"  # one waits at a time: this one stays
            finally:
                release.set()
            await started(pilot)
            await wait_for(pilot, lambda: len(app.chat.conversation.turns) == 1)
            assert app.chat.conversation.turns[0].question == "hi there"
            assert question.value == "and this"

    asyncio.run(run())


def test_a_question_sent_while_it_starts_comes_back_when_the_start_fails(
        settings: Settings) -> None:
    release = threading.Event()

    async def run() -> None:
        app = MeanCacheApp(settings, held_start(release, fails=True))
        async with app.run_test(size=(160, 40)) as pilot:
            try:
                question = await send_while_starting(pilot, app, "hi there")
            finally:
                release.set()
            await wait_for(pilot, lambda: question.value == "hi there")  # not lost
            assert app.session is None and not app.chat.conversation.turns

    asyncio.run(run())


def test_what_is_typed_before_the_chat_is_drawn_carries_over_to_it(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """While the program's heavy parts load (seconds on a cold start), the start screen's
    prompt takes keys: the question sent there is asked once the chat can, and the text
    not yet sent is in the chat's prompt."""
    open_session = MeanCacheApp.open_session
    monkeypatch.setattr(MeanCacheApp, "open_session", lambda app: None)  # still loading

    async def run() -> None:
        app = MeanCacheApp(settings, start_embedded_upstream)
        async with app.run_test(size=(160, 40)) as pilot:
            start = app.screen
            assert isinstance(start, StartScreen)
            await wait_for(pilot, lambda: start.query_one("#question", Input).has_focus)
            # sent with a newline: an enter typed before the app took the terminal, which
            # the terminal's line mode turned into one
            await pilot.press(*"hi there", "ctrl+j", *"and th")
            assert (start.sent, start.typed) == ("hi there", "and th")
            open_session(app)  # the program has loaded
            await started(pilot)
            await wait_for(pilot, lambda: len(app.chat.conversation.turns) == 1)
            assert app.chat.conversation.turns[0].question == "hi there"
            assert app.chat.query_one("#question", Input).value == "and th"

    asyncio.run(run())


def test_keys_that_reach_the_chat_while_it_is_shown_follow_the_start_screens(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The start screen's prompt is taken over once the chat is shown: what reached the
    chat's prompt meanwhile follows it, and the question sent there still waits."""
    monkeypatch.setattr(MeanCacheApp, "open_session", lambda app: None)  # never opens

    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(160, 40)) as pilot:
            chat = ChatScreen(settings, FederatedParticipation(settings))
            await app.push_screen(chat)
            prompt = chat.query_one("#question", Input)
            prompt.value = "th"  # keys that reached the chat while it was being shown
            chat.take_over("and ", "hi there")
            assert prompt.value == "and th"
            await wait_for(pilot, lambda: prompt.has_focus)
            await pilot.press("enter")  # a question already waits: this one stays
            assert prompt.value == "and th"

    asyncio.run(run())


def test_keys_read_with_an_enter_stay_after_it(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keys typed ahead reach the app in one read (an enter typed before the app took the
    terminal arrives as a newline among them): the question sent is what came before the
    enter, and what came after stays in the prompt."""
    monkeypatch.setattr(MeanCacheApp, "open_session", lambda app: None)  # still loading
    burst = [(c if c != " " else "space", c) for c in "hi there"] + [("ctrl+j", "\n")] + [
        (c if c != " " else "space", c) for c in "and th"]

    async def run() -> None:
        app = MeanCacheApp(settings)
        async with app.run_test(size=(160, 40)) as pilot:
            start = app.screen
            assert isinstance(start, StartScreen)
            await wait_for(pilot, lambda: start.query_one("#question", Input).has_focus)
            for key, character in burst:  # as the driver posts one read's keys: no waits
                app.post_message(Key(key, character))
            await wait_for(pilot, lambda: start.sent is not None and start.typed == "and th")
            assert start.sent == "hi there"

    asyncio.run(run())


def test_the_starts_last_word_after_the_app_has_closed_changes_nothing(
        settings: Settings) -> None:
    """The worker that opens the session may finish while the app shuts down (a user who
    quits during the start, a test that ends): a failure is then told to nobody, where it
    used to fail the worker on a status line already taken down, and a session opened too
    late is closed, its embedded upstream stopped, rather than left running."""
    session = ChatSession.open(settings, start_upstream=start_embedded_upstream)
    assert session.embedded is not None
    url = session.embedded.url
    assert httpx.get(f"{url}/health", timeout=5).status_code == 200  # it serves

    async def run() -> MeanCacheApp:
        app = MeanCacheApp(settings.model_copy(update={"upstream_model": None}))
        async with app.run_test(size=(160, 40)) as pilot:
            await wait_for(pilot, lambda: app._chat is not None)
        app._failed("too late")
        await app._opened(session)
        return app

    try:
        app = asyncio.run(run())
    finally:  # whatever failed above, the test leaves no server running
        session.embedded.stop()
    assert app.session is None
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{url}/health", timeout=5)
