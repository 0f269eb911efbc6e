"""`meancache pack update` against a hostile upstream (issue 26, item 8), a real HTTP server
on loopback answering what no honest upstream would: every case ends in one clear line and
exit status 2, never a traceback, with no partial file left and the pack in use kept. And
`meancache proxy` in front of one (issue 38): answers past their caps or their deadline,
errors that would leak, answers out of schema."""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import httpx
import meancache.client.pack.download as download
import pytest
from meancache.client.config import load_settings
from meancache.client.errors import UpstreamUnavailableError
from meancache.client.proxy.apps import key_digest
from meancache.client.proxy.partitions import Partition
from meancache.client.proxy.service import Proxy
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.pack import write_pack
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Mount, Route

from meancache.cli import main
from tests.support.servers import serving

MODEL = "builtin:tiny"
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
REQUESTED: list[str] = []


def pack_bytes(tmp_path: Path, model: str = MODEL, **manifest: object) -> bytes:
    path = tmp_path / "source.pack"
    write_pack(path, [("what is rice", "a grain")], model, 1.0)
    head, body = path.read_bytes().split(b"\n", 1)
    return json.dumps({**json.loads(head), **manifest}).encode() + b"\n" + body


def upstream(models: Callable[[], Response], manifest: Callable[[], Response],
             latest: Callable[[], Response]) -> Starlette:
    def route(path: str, answer: Callable[[], Response]) -> Route:
        async def endpoint(request: Request) -> Response:
            REQUESTED.append(path)
            return answer()
        return Route(path, endpoint)
    return Starlette(routes=[route("/v1/models", models),
                             route("/v1/packs/latest/manifest", manifest),
                             route("/v1/packs/latest", latest)])


def models_ok() -> Response:
    return JSONResponse(MODELS)


def no_manifest() -> Response:
    return JSONResponse({"error": {"message": "no"}}, status_code=404)


def update(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    REQUESTED.clear()
    code = main(["--data-dir", str(tmp_path / "data"), "pack", "update", "--upstream", url])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    leftovers = [p.name for p in (tmp_path / "data" / "packs").glob("*.download*")]
    assert leftovers == [], leftovers
    return code, " ".join(err.split())


@pytest.mark.parametrize(("models", "fragment"), [
    (lambda: PlainTextResponse("<html>hello</html>"), "did not answer GET /v1/models"),
    (lambda: JSONResponse({"data": {"id": MODEL}}), "did not answer GET /v1/models"),
    (lambda: JSONResponse({"data": [{"id": {"nested": 1}}]}), "did not answer GET /v1/models"),
    (lambda: JSONResponse({"data": [{"id": "m" * 100_000}]}), "did not answer GET /v1/models"),
    (lambda: PlainTextResponse("[" * 3_000_000), "did not answer GET /v1/models"),
])
def test_an_odd_model_list_is_one_clear_line(
        models: Callable[[], Response], fragment: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(upstream(models, no_manifest, no_manifest)) as url:
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and fragment in err, err


@pytest.mark.parametrize(("manifest", "fragment"), [
    ({"body_bytes": 2**62}, "out of range"),
    ({"body_bytes": 2**30}, "over the 268435456-byte limit"),
    ({"body_bytes": -5}, "wrong type"),
    ({"body_bytes": True}, "wrong type"),
    ({"model": "another-model"}, "holds answers of model 'another-model'"),
])
def test_the_manifest_is_checked_before_the_body_comes_down(
        manifest: dict[str, object], fragment: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    body = pack_bytes(tmp_path)
    head = {**json.loads(body.split(b"\n", 1)[0]), **manifest}
    with serving(upstream(models_ok, lambda: JSONResponse(head),
                          lambda: Response(body))) as url:
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and fragment in err, err
    assert "/v1/packs/latest" not in REQUESTED  # refused on the manifest alone


@pytest.mark.parametrize("manifest", [{"body_bytes": 2**62}, {"body_bytes": -1},
                                      {"count": 2**62}, {"body_sha256": 5}])
def test_a_pack_whose_own_manifest_lies_is_refused_and_removed(
        manifest: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream without the manifest endpoint: the pack's first line is checked."""
    body = pack_bytes(tmp_path, **manifest)
    with serving(upstream(models_ok, no_manifest, lambda: Response(body))) as url:
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and "pack" in err, err


def test_a_download_has_an_overall_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert getattr(download, "PACK_DEADLINE_SECONDS", 0) >= 60  # a slow link has its time
    monkeypatch.setattr(download, "PACK_DEADLINE_SECONDS", 1.5, raising=False)
    body = pack_bytes(tmp_path)

    async def drip() -> AsyncIterator[bytes]:  # each byte well inside any read timeout
        for byte in body:
            yield bytes([byte])
            await asyncio.sleep(0.2)

    with serving(upstream(models_ok, no_manifest, lambda: StreamingResponse(drip()))) as url:
        start = time.monotonic()
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and "took longer than" in err, err
    assert time.monotonic() - start < 10


# --- the proxy in front of a hostile upstream (issue 38, findings 3 and 5) -----------------
# A stub, because a real server never streams past max_tokens, leaks into its errors or
# answers out of schema. Each kind is mounted at /KIND.
HOSTILE_MODEL = "hostile"
SECRET = "sk-live-SECRET-0123456789"
ANSWER_TOKENS = 16  # the proxy's answer_max_tokens here
RELAYED = {"stop": ["\n"]}  # a field the cache keeps no answers under: the proxy relays it


def chunk(content: str | None = None, finish: str | None = None) -> dict[str, object]:
    delta = {} if content is None else {"content": content}
    return {"id": "up-1", "object": "chat.completion.chunk", "created": 0,
            "model": HOSTILE_MODEL,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


# Each stream the stub served, once it ended (or the proxy hung up): (seconds, pieces sent).
STREAMED: list[tuple[float, int]] = []


def endless(pieces: int, pause: float = 0.0) -> Response:
    """``pieces`` words, streamed (or, asked for a whole answer, all in one message):
    far past any max_tokens the proxy asks for."""
    async def body() -> AsyncIterator[str]:
        start, sent = time.monotonic(), 0
        try:
            for n in range(pieces):
                yield f"data: {json.dumps(chunk(f'word{n} '))}\n\n"
                sent += 1
                if pause:
                    await asyncio.sleep(pause)
            yield f"data: {json.dumps(chunk(finish='stop'))}\n\ndata: [DONE]\n\n"
        finally:
            STREAMED.append((time.monotonic() - start, sent))

    return StreamingResponse(body(), media_type="text/event-stream")


def whole(content: str) -> Response:
    return JSONResponse({"id": "up-1", "object": "chat.completion", "created": 0,
                         "model": HOSTILE_MODEL, "choices": [{
                             "index": 0, "finish_reason": "stop",
                             "message": {"role": "assistant", "content": content}}],
                         "usage": {"prompt_tokens": 3, "completion_tokens": 5000,
                                   "total_tokens": 5003}})


def hostile_app() -> Starlette:
    def kind(name: str, answer: Callable[[Request, bool], Response]) -> Mount:
        async def chat(request: Request) -> Response:
            return answer(request, bool((await request.json()).get("stream")))

        return Mount(f"/{name}", routes=[
            Route("/v1/models", lambda request: JSONResponse(
                {"object": "list", "data": [{"id": HOSTILE_MODEL, "object": "model"}]})),
            Route("/v1/chat/completions", chat, methods=["POST"])])

    def leaky(request: Request, stream: bool) -> Response:
        return JSONResponse({"error": {"message": f"db password {SECRET} at "
                                                  f"{request.base_url}internal/admin"}},
                            status_code=500)

    def nope(request: Request, stream: bool) -> Response:
        if stream:
            return StreamingResponse(iter([f"data: {json.dumps({'choices': 'nope'})}\n\n"]),
                                     media_type="text/event-stream")
        return JSONResponse({"choices": "nope", "usage": -1})

    return Starlette(routes=[
        kind("forever", lambda r, stream: endless(5000) if stream
             else whole("word " * 50_000)),
        kind("slow", lambda r, stream: endless(40, pause=0.2)),
        kind("leaky", leaky),
        kind("nope", nope),
    ])


@pytest.fixture(scope="module")
def hostile() -> Iterator[str]:
    with serving(hostile_app()) as url:
        yield url


def open_proxy(tmp_path: Path, upstream: str) -> Proxy:
    settings = load_settings(tmp_path / "config", tmp_path / "data", environ={},
                             encoder_model="minilm", encoder_backend="torch",
                             upstream_url=upstream, answer_max_tokens=ANSWER_TOKENS)
    return Proxy.open(settings)


def ask_proxy(url: str, stream: bool, **extra: object) -> tuple[int, str, list[dict]]:
    """(status, x-meancache, the answer as JSON objects: one, or each event's)."""
    body = {"model": HOSTILE_MODEL, "stream": stream,
            "messages": [{"role": "user", "content": "How do I bake bread?"}]} | extra
    with httpx.stream("POST", f"{url}/chat/completions", json=body, timeout=60,
                      headers={"Authorization": "Bearer key-one"}) as response:
        text = response.read().decode()
    if not stream or response.status_code != 200:
        return response.status_code, response.headers.get("x-meancache", ""), [json.loads(text)]
    events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" or "error" in events[-1], events[-3:]
    return 200, response.headers["x-meancache"], [json.loads(e) for e in events
                                                  if e != "[DONE]"]


def text_of(answer: list[dict]) -> str:
    if "message" in answer[0]["choices"][0]:
        return answer[0]["choices"][0]["message"]["content"]
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in answer if c["choices"])


def stored(proxy: Proxy) -> int:
    partition = proxy.state.partitions.get(key_digest("key-one"), ())
    assert isinstance(partition, Partition)
    try:
        return len(partition.cache)
    finally:
        proxy.state.partitions.release(partition)


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("max_tokens", [None, 8], ids=["proxy's", "app's smaller"])
def test_an_endless_answer_to_a_cacheable_question_is_cut_marked_and_not_stored(
        hostile: str, tmp_path: Path, stream: bool, max_tokens: int | None) -> None:
    """Cut at the proxy's answer_max_tokens, or at the app's smaller max_tokens (a
    question the cache still answers, asked upstream for no more)."""
    proxy = open_proxy(tmp_path, f"{hostile}/forever")
    limit = max_tokens or ANSWER_TOKENS
    try:
        url = proxy.start()
        extra = {} if max_tokens is None else {"max_tokens": max_tokens}
        status, where, answer = ask_proxy(url, stream, **extra)
        assert status == 200 and where == "miss"
        words = text_of(answer).split()
        assert 1 <= len(words) <= limit, len(words)
        last = answer[-1]
        assert last["choices"][0]["finish_reason"] == "length"
        assert f"{limit} tokens" in last["meancache"]["cut"]
        assert stored(proxy) == 0
        assert ask_proxy(url, stream)[1] == "miss"  # asked again: nothing was cached
    finally:
        proxy.close()


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_an_endless_relayed_answer_is_cut_at_the_requests_max_tokens(
        hostile: str, tmp_path: Path, stream: bool) -> None:
    proxy = open_proxy(tmp_path, f"{hostile}/forever")
    try:
        status, where, answer = ask_proxy(proxy.start(), stream, max_tokens=8, **RELAYED)
    finally:
        proxy.close()
    assert status == 200 and where == "bypass; reason=field-stop"
    text = text_of(answer)
    assert 0 < len(text.encode()) <= 8 * 32  # a whole answer: cut at 32 bytes a token
    assert len(text.split()) <= 8 or not stream  # streamed: at 8 pieces
    assert answer[-1]["choices"][0]["finish_reason"] == "length"
    assert "8 tokens" in answer[-1]["meancache"]["cut"]


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("max_tokens", [None, 8], ids=["cached", "relayed"])
def test_an_upstreams_error_text_and_url_never_reach_the_app(
        hostile: str, tmp_path: Path, stream: bool, max_tokens: int | None) -> None:
    upstream = f"{hostile}/leaky"
    proxy = open_proxy(tmp_path, upstream)
    try:
        extra = {} if max_tokens is None else {"max_tokens": max_tokens, **RELAYED}
        status, _, answer = ask_proxy(proxy.start(), stream, **extra)
    finally:
        proxy.close()
    told = json.dumps(answer)
    assert status == 502, told
    assert SECRET not in told and "internal" not in told and hostile not in told
    assert "127.0.0.1" not in told, told
    assert "500" in answer[-1]["error"]["message"], told


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
def test_a_relayed_answer_out_of_schema_is_a_502(hostile: str, tmp_path: Path,
                                                 stream: bool) -> None:
    proxy = open_proxy(tmp_path, f"{hostile}/nope")
    try:
        status, _, answer = ask_proxy(proxy.start(), stream, max_tokens=8, **RELAYED)
    finally:
        proxy.close()
    error = answer[-1]["error"]
    if stream:  # the headers went out before the first event: an error event ends it
        assert len(answer) == 1 and "not a chat-completion chunk (choices" in error["message"]
    else:
        assert status == 502 and error["code"] == "bad_upstream_answer"
        assert "not a chat completion (choices" in error["message"], error


@pytest.mark.parametrize("stream", [True, False], ids=["streamed", "whole"])
@pytest.mark.parametrize("max_tokens", [None, 20], ids=["cached", "relayed"])
def test_an_answer_past_its_deadline_is_cut_off(hostile: str, tmp_path: Path, stream: bool,
                                                max_tokens: int | None) -> None:
    """A piece every 0.2 s: well inside the read timeout, 8 s in all, never done within
    the 1 s deadline set here (600 s as shipped). The deadline bounds the upstream's
    answer, so it is measured there: the stub's stream must end (the proxy hung up) long
    before its 40 pieces, whatever the proxy did before asking (opening the app's cache
    and embedding the question take seconds on a loaded machine and are not the
    upstream's time: a wall clock around the whole request failed on them)."""
    proxy = open_proxy(tmp_path, f"{hostile}/slow")
    assert proxy.state.upstream.answer_seconds >= 60
    proxy.state.upstream.answer_seconds = 1.0
    served = len(STREAMED)
    try:
        extra = {} if max_tokens is None else {"max_tokens": max_tokens, **RELAYED}
        status, _, answer = ask_proxy(proxy.start(), stream, **extra)
        assert stored(proxy) == 0
    finally:
        proxy.close()
    assert "took longer than 1 s" in answer[-1]["error"]["message"], answer[-1]
    # streamed, the headers go out with the first piece (0.2 s in): then the error is the
    # last event of a 200; on a loaded machine the deadline can pass before that piece
    # reached the proxy, and nothing was sent yet: a 502
    assert status in ((200, 502) if stream else (502,)), status
    deadline = time.monotonic() + 30
    while len(STREAMED) == served:  # the stub sees the hang-up at its next piece at most
        assert time.monotonic() < deadline, "the proxy never hung up on the upstream"
        time.sleep(0.05)
    seconds, pieces = STREAMED[served]
    assert pieces < 40 and seconds < 4, (seconds, pieces)  # cut, not answered in full


def test_an_error_body_is_read_only_up_to_its_cap() -> None:
    """A 500 whose body would be 64 MiB, 64 KiB every 20 ms (20 s in all): the client
    reads what it needs of it and hangs up, instead of waiting for all of it."""
    async def chat(request: Request) -> Response:
        async def body() -> AsyncIterator[bytes]:
            for _ in range(1024):
                yield b"x" * 65536
                await asyncio.sleep(0.02)
                if await request.is_disconnected():  # the client hung up: done
                    return
        return StreamingResponse(body(), status_code=500, media_type="text/plain")

    app = Starlette(routes=[Route("/v1/chat/completions", chat, methods=["POST"])])

    async def ask(url: str) -> str:
        async with UpstreamClient(url, model=HOSTILE_MODEL) as client:
            with pytest.raises(UpstreamUnavailableError) as failed:
                async for _ in client.stream_chat([{"role": "user", "content": "hi"}]):
                    pass
        return str(failed.value)

    with serving(app) as url:
        start = time.monotonic()
        message = asyncio.run(ask(url))
        took = time.monotonic() - start
    assert "answered 500" in message and len(message) < 400
    assert took < 10, took
