"""Do cache hits wait behind misses? Eight apps on one `meancache proxy` at once: four ask
questions the cache holds (whole answers, `--pause-ms` apart), four stream long misses
from a slow upstream. The hits' latency beside the misses is printed against the same
hits alone, for misses under other apps' keys (their caches open), under the hit apps'
own key, and from new apps (each miss opens a cache: at most MAX_NAMESPACES apps, past
which the proxy relays).

The proxy is the real one (MiniLM on ONNX, the client's runtime) with the openai SDK as
every app. The upstream is a deliberately slow OpenAI-compatible server on loopback (the
one fake here, and only for its slowness): a streamed answer is `--words` words, one
every `--word-ms` ms; the cached questions were stored through the proxy beforehand,
from the same upstream answering at once. Questions: distinct QQP dev questions.

    python benchmarks/proxy_load.py            # 20 s of hits per scenario
    python benchmarks/proxy_load.py --quick    # 6 s
"""

import asyncio
import json
import shutil
import threading
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import numpy as np
import openai
from _common import (
    apply_defaults,
    base_parser,
    heading,
    load_qqp,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
    qqp_questions,
    sample,
)
from meancache.client.config import load_settings
from meancache.client.proxy.service import Proxy
from meancache.shared.loopback_server import LoopbackServer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

MODEL = "slow"
HIT_APPS = MISS_APPS = 4


@dataclass
class Pace:
    """How the slow upstream answers: ``words`` words, ``pause`` seconds apart."""

    words: int
    pause: float


def slow_upstream(pace: Pace) -> Starlette:
    """An OpenAI-compatible upstream that streams ``pace.words`` words at ``pace.pause``
    (a whole answer comes after the same time); usage counts one token a word."""
    async def chat(request: Request) -> Response:
        body = await request.json()
        words, pause = pace.words, pace.pause
        head = {"id": "slow", "created": 0, "model": MODEL}
        usage = {"prompt_tokens": 10, "completion_tokens": words, "total_tokens": 10 + words}
        if not body.get("stream"):
            await asyncio.sleep(words * pause)
            return JSONResponse(head | {"object": "chat.completion", "usage": usage,
                                        "choices": [{"index": 0, "finish_reason": "stop",
                                                     "message": {"role": "assistant",
                                                                 "content": "word " * words}}]})

        async def events() -> AsyncIterator[str]:
            chunk = head | {"object": "chat.completion.chunk"}
            for _ in range(words):
                yield "data: " + json.dumps(chunk | {"choices": [{
                    "index": 0, "delta": {"content": "word "}, "finish_reason": None}]}) + "\n\n"
                await asyncio.sleep(pause)
            yield "data: " + json.dumps(chunk | {"choices": [{
                "index": 0, "delta": {}, "finish_reason": "stop"}]}) + "\n\n"
            yield "data: " + json.dumps(chunk | {"choices": [], "usage": usage}) + "\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(events(), media_type="text/event-stream")

    def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": MODEL, "object": "model"}]})

    return Starlette(routes=[Route("/v1/models", models),
                             Route("/v1/chat/completions", chat, methods=["POST"])])


@dataclass
class Run:
    hits: list[float] = field(default_factory=list)  # seconds per whole hit
    missed: list[float] = field(default_factory=list)  # seconds per streamed miss
    headers: list[str] = field(default_factory=list)  # the hits' x-meancache
    errors: list[str] = field(default_factory=list)


def hit_app(url: str, key: str, questions: list[str], until: float, pause: float, run: Run,
            lock: threading.Lock) -> None:
    """Asks ``questions`` in turn, ``pause`` seconds apart, until ``until`` (monotonic)."""
    app = openai.OpenAI(base_url=url, api_key=key, max_retries=0, timeout=300)
    i = 0
    while time.monotonic() < until:
        time.sleep(pause)
        i += 1
        start = time.perf_counter()
        try:
            raw = app.chat.completions.with_raw_response.create(
                model=MODEL, messages=[{"role": "user", "content": questions[i % len(questions)]}])
            raw.parse()
        except openai.APIError as exc:
            with lock:
                run.errors.append(f"hit: {exc}")
            continue
        with lock:
            run.hits.append(time.perf_counter() - start)
            run.headers.append(raw.headers.get("x-meancache", ""))


def miss_app(url: str, key: str, questions: list[str], stop: threading.Event, run: Run,
             lock: threading.Lock) -> None:
    """Streams fresh questions under ``key`` until ``stop``; a key ending in "*" is a new
    app's (a new cache) on every question."""
    n = 0
    while not stop.is_set() and questions:
        with lock:
            question = questions.pop()
        n += 1
        app = openai.OpenAI(base_url=url, api_key=key.replace("*", f"-{n}"), max_retries=0,
                            timeout=300)
        start = time.perf_counter()
        try:
            with app.chat.completions.with_streaming_response.create(
                    model=MODEL, stream=True,
                    messages=[{"role": "user", "content": question}]) as raw:
                for _ in raw.parse():
                    pass
        except openai.APIError as exc:
            with lock:
                run.errors.append(f"miss: {exc}")
            continue
        with lock:
            run.missed.append(time.perf_counter() - start)


def scenario(url: str, cached: list[str], fresh: list[str], seconds: float, pause: float,
             miss_keys: list[str] | None) -> Run:
    """The hit apps asking cached questions for ``seconds``; beside them, when
    ``miss_keys`` is given, one miss app per key streaming fresh questions until the
    hits are done (started first, so that every hit runs beside streams)."""
    run, lock, stop = Run(), threading.Lock(), threading.Event()
    misses = [threading.Thread(target=miss_app, args=(url, key, fresh, stop, run, lock))
              for key in miss_keys or []]
    for thread in misses:
        thread.start()
    if misses:
        time.sleep(1.0)  # the streams are under way
    until = time.monotonic() + seconds
    hits = [threading.Thread(target=hit_app, args=(url, "hits", cached[i::HIT_APPS], until,
                                                   pause, run, lock)) for i in range(HIT_APPS)]
    for thread in hits:
        thread.start()
    for thread in hits:
        thread.join()
    stop.set()
    for thread in misses:
        thread.join()
    return run


def ms(seconds: list[float], q: float) -> str:
    return f"{float(np.percentile(seconds, q)) * 1000:.1f}" if seconds else "-"


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--seconds", type=float, help="how long each scenario's hits run")
    parser.add_argument("--pause-ms", type=float, default=100.0,
                        help="each hit app's pause between its questions")
    parser.add_argument("--words", type=int, default=200, help="words in a streamed miss")
    parser.add_argument("--word-ms", type=float, default=25.0, help="ms between the words")
    args = apply_defaults(parser.parse_args(), {"seconds": 20.0}, {"seconds": 6.0})
    questions = sample(qqp_questions(load_qqp(args.data_dir, "dev")), 16 + 400, args.seed)
    cached, fresh = questions[:16], questions[16:]
    pace = Pace(args.words, 0.0)
    upstream = LoopbackServer(slow_upstream(pace), "slow-upstream", lifespan="off", ws="none")
    assert upstream.start(), "the slow upstream did not start"
    data = args.cache_dir / "proxy-load"
    shutil.rmtree(data / "proxy", ignore_errors=True)  # every run starts with empty caches
    settings = load_settings(data / "config", data, environ={}, encoder_model="minilm",
                             upstream_url=upstream.url, answer_max_tokens=512)
    note(f"starting the proxy; {machine_load()}")
    proxy = Proxy.open(settings)
    try:
        url = proxy.start()
        miss_keys = [f"miss-{i}" for i in range(MISS_APPS)]
        for key, asked in [("hits", q) for q in cached] + [(k, fresh.pop()) for k in miss_keys]:
            # stored at once (the upstream does not pause yet): the cached questions, and
            # a first answer for each miss app, so that its cache is open before the runs
            openai.OpenAI(base_url=url, api_key=key, max_retries=0).chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": asked}])
        pace.pause = args.word_ms / 1000
        timing = (args.seconds, args.pause_ms / 1000)
        note("hits alone")
        alone = scenario(url, cached, fresh, *timing, None)
        note("hits beside misses under other keys")
        apart = scenario(url, cached, fresh, *timing, miss_keys)
        note("hits beside misses under the hit apps' key")
        shared = scenario(url, cached, fresh, *timing, ["hits"] * MISS_APPS)
        note("hits beside misses of new apps (a cache opened for each)")
        new = scenario(url, cached, fresh, *timing,
                       [f"new-{i}*" for i in range(MISS_APPS)])
    finally:
        proxy.close()
        upstream.stop()
    stream_s = args.words * args.word_ms / 1000
    heading(f"Hits beside streamed misses: {HIT_APPS} apps asking cached questions (whole "
            f"answers, {args.pause_ms:g} ms apart, for {args.seconds:g} s), {MISS_APPS} apps "
            f"streaming misses of {args.words} words at {args.word_ms:g} ms (about "
            f"{stream_s:.1f} s each) from a slow upstream; "
            f"one `meancache proxy`, MiniLM ONNX, openai SDK; {machine_load()}")
    table = make_table(["hits", "n", "p50 ms", "p99 ms", "max ms", "served as hits",
                        "misses streamed", "miss p50 s", "errors"])
    for name, run in (("alone", alone), ("beside misses, other keys", apart),
                      ("beside misses, the same key", shared),
                      ("beside misses of new apps", new)):
        marked = sum(h.startswith("hit") for h in run.headers)
        table.add_row(name, str(len(run.hits)), ms(run.hits, 50), ms(run.hits, 99),
                      ms(run.hits, 100), f"{marked}/{len(run.headers)}", str(len(run.missed)),
                      f"{np.median(run.missed):.2f}" if run.missed else "-",
                      str(len(run.errors)))
    print_table(table)
    for run in (alone, apart, shared, new):
        for error in run.errors[:3]:
            print(error)
    print_command()


if __name__ == "__main__":
    main()
