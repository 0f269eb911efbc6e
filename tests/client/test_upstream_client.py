"""The upstream client against a scripted OpenAI-compatible server on loopback: streamed
answers, and a clear UpstreamRequestError for every way an upstream can fail."""

import asyncio
from collections.abc import Iterator

import pytest
from meancache.client.upstream_client import (
    Completed,
    Delta,
    UpstreamClient,
    UpstreamRejectedError,
    UpstreamUnavailableError,
    api_root,
)

from tests.support.servers import RECEIVED, free_port, scripted_upstream


@pytest.fixture(scope="module")
def server_url() -> Iterator[str]:
    with scripted_upstream() as url:
        yield url

def collect(url: str) -> tuple[list[Delta | Completed], BaseException | None]:
    """Every event the client yielded, and the error that ended the stream, if any."""
    async def run() -> tuple[list[Delta | Completed], BaseException | None]:
        got: list[Delta | Completed] = []
        async with UpstreamClient(url, connect_retries=1) as client:
            try:
                async for event in client.stream_chat([{"role": "user", "content": "hi"}]):
                    got.append(event)
            except Exception as exc:  # the caller asserts which
                return got, exc
        return got, None

    return asyncio.run(run())


def test_streams_deltas_then_usage(server_url: str) -> None:
    got, error = collect(f"{server_url}/ok")
    assert error is None
    assert got[:2] == [Delta("Hel"), Delta("lo")]
    done = got[-1]
    assert isinstance(done, Completed) and len(got) == 3
    assert (done.text, done.prompt_tokens, done.completion_tokens, done.cached_tokens,
            done.finish_reason) == ("Hello", 12, 2, 7, "stop")


def test_an_error_event_mid_answer_raises_after_what_arrived(server_url: str) -> None:
    got, error = collect(f"{server_url}/broken")
    assert got == [Delta("Hel")]
    assert isinstance(error, UpstreamUnavailableError)
    assert str(error) == "the upstream failed mid-answer: out of memory"


def test_a_5xx_is_unavailable_and_a_4xx_is_rejected(server_url: str) -> None:
    _, error = collect(f"{server_url}/busy")
    assert isinstance(error, UpstreamUnavailableError)
    assert str(error) == f"the upstream at {server_url}/busy answered 503: overloaded"
    assert error.status == 503
    _, error = collect(f"{server_url}/bad")
    assert isinstance(error, UpstreamRejectedError)
    assert (str(error), error.status) == ("max_tokens too large", 400)


def test_an_answer_that_is_not_a_stream_is_a_clear_error(server_url: str) -> None:
    _, error = collect(f"{server_url}/plain")
    assert isinstance(error, UpstreamUnavailableError)
    assert "did not answer with an event stream" in str(error)


def test_an_unreachable_upstream_is_named() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    _, error = collect(url)
    assert isinstance(error, UpstreamUnavailableError)
    assert str(error).startswith(f"cannot reach the upstream at {url} (")


@pytest.mark.parametrize("url", ["http://h:8080", "http://h:8080/", "http://h:8080/v1",
                                 "http://h:8080/v1/", " http://h:8080/v1// "])
def test_a_base_url_is_taken_with_or_without_v1(url: str) -> None:
    assert api_root(url) == "http://h:8080"
    assert api_root("http://h/proxy/v1") == "http://h/proxy"  # only a final /v1 goes


def test_the_stream_reaches_chat_completions_under_a_v1_base_url(server_url: str) -> None:
    got, error = collect(f"{server_url}/ok/v1/")
    assert error is None and got[:2] == [Delta("Hel"), Delta("lo")]


def test_an_empty_answer_keeps_the_servers_finish_reason(server_url: str) -> None:
    got, error = collect(f"{server_url}/empty")
    assert error is None
    done = got[-1]
    assert isinstance(done, Completed)
    assert (done.text, done.finish_reason) == (" \n", "stop")


def check_upstream(url: str, api_key: str | None, model: str | None) -> str:
    client = UpstreamClient(url, api_key, model)
    assert client.check() == client.model
    return client.model


def test_the_start_check_returns_the_model_to_ask_for(server_url: str) -> None:
    assert check_upstream(f"{server_url}/ok/v1", None, None) == "scripted"
    assert check_upstream(f"{server_url}/ok", "key", "scripted") == "scripted"


def test_the_start_check_names_the_url_and_what_is_wrong(server_url: str) -> None:
    url = f"{server_url}/ok/v1"
    with pytest.raises(UpstreamRejectedError) as missing:
        check_upstream(url, None, "gpt-4o")
    assert str(missing.value) == (f"the upstream at {url} does not serve the model 'gpt-4o'; "
                                  "it serves: scripted (choose with --model or upstream_model)")
    locked = f"{server_url}/locked/v1"
    with pytest.raises(UpstreamRejectedError) as refused:
        check_upstream(locked, "wrong", None)
    assert refused.value.status == 401
    assert str(refused.value).startswith(f"the upstream at {locked} refused the API key (401: "
                                         "Incorrect API key provided); pass --api-key")
    gone = f"http://127.0.0.1:{free_port()}/v1"
    with pytest.raises(UpstreamUnavailableError) as unreachable:
        check_upstream(gone, None, None)
    assert str(unreachable.value).startswith(f"cannot reach the upstream at {gone} (")
    for error in (missing, refused, unreachable):
        assert "\n" not in str(error.value)


def test_a_request_without_generation_settings_carries_the_settings_defaults(
        server_url: str) -> None:
    from pathlib import Path

    from meancache.client.config import Settings

    RECEIVED.clear()
    got, error = collect(f"{server_url}/ok")
    assert error is None
    defaults = Settings(config_dir=Path("config"), data_dir=Path("data"))
    assert (RECEIVED[-1]["temperature"], RECEIVED[-1]["max_tokens"]) == (
        defaults.temperature, defaults.answer_max_tokens) == (0.0, 512)


def test_the_configured_sampling_fields_reach_the_real_upstream(upstream_url: str) -> None:
    """The embedded upstream (builtin:tiny here) takes the config's ``upstream_sampling``
    with each question: a strong DRY penalty changes an answer that repeats itself, and a
    value the server refuses comes back as its own error naming the field."""
    question = [{"role": "user", "content": "say it again"}]

    async def answer(sampling: dict[str, float | bool]) -> Completed:
        async with UpstreamClient(upstream_url, connect_retries=0, sampling=sampling) as client:
            events = [e async for e in client.stream_chat(question, max_tokens=40)]
        assert isinstance(events[-1], Completed)
        return events[-1]

    async def run() -> None:
        off = {"repetition_penalty": 1.0, "dry_multiplier": 0.0, "stop_on_loops": False}
        unguarded = await answer(off)
        text = unguarded.text  # byte-level tokens: a repeated 3-character run is one of 3
        assert any(text.count(text[i:i + 3]) > 1 for i in range(len(text) - 2)), \
            "this greedy answer repeats nothing: the premise does not hold"
        dry = await answer({**off, "dry_multiplier": 8.0, "dry_allowed_length": 1})
        assert dry.text != unguarded.text
        with pytest.raises(UpstreamRejectedError, match="dry_multiplier must lie in"):
            await answer({"dry_multiplier": 9.0})

    asyncio.run(run())
