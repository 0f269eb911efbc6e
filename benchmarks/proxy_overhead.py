"""What `meancache proxy` costs an app, and what a hit saves: time to first token of a
miss through the proxy against the same request straight to the upstream (paired, per
question, the order alternating), and a hit's end-to-end latency (streamed and whole),
all in one run, with the official openai SDK as the app.

Upstream: the embedded meancache upstream on loopback (`builtin:tiny` by default, a
random-init Llama whose timing does not depend on its weights; `--model
builtin:gemma-3-270m` for the real one, converted once into the data dir). Both paths
ask it greedily for `--max-tokens`.
Questions: distinct QQP dev questions (held out from every tuning); each is asked once
as a miss and then again (the hit). Encoder: MiniLM on ONNX, the client's runtime.

    python benchmarks/proxy_overhead.py            # 40 questions
    python benchmarks/proxy_overhead.py --quick    # 8 questions
    python benchmarks/proxy_overhead.py --model builtin:gemma-3-270m --questions 15
"""

import shutil
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import openai
from _common import (
    Latency,
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
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.serve import BackgroundServer


def streamed(client: openai.OpenAI, model: str, question: str, max_tokens: int | None
             ) -> tuple[float, float, str]:
    """(first token, whole answer) seconds of one streamed answer, and its x-meancache."""
    extra: dict[str, Any] = {} if max_tokens is None else {"max_tokens": max_tokens,
                                                           "temperature": 0.0}
    start = time.perf_counter()
    first = None
    with client.chat.completions.with_streaming_response.create(
            model=model, stream=True, messages=[{"role": "user", "content": question}],
            **extra) as raw:
        for chunk in raw.parse():
            if first is None and chunk.choices and chunk.choices[0].delta.content:
                first = time.perf_counter() - start
        total = time.perf_counter() - start
        return first if first is not None else total, total, raw.headers.get("x-meancache", "")


def whole(client: openai.OpenAI, model: str, question: str) -> tuple[float, str]:
    start = time.perf_counter()
    raw = client.chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": question}])
    raw.parse()
    return time.perf_counter() - start, raw.headers.get("x-meancache", "")


def row(table: Any, name: str, seconds: list[float]) -> None:
    stats = Latency.of(seconds)
    p90 = float(np.percentile(seconds, 90)) * 1000
    table.add_row(name, str(stats.n), f"{stats.p50:.1f}", f"{p90:.1f}",
                  f"{stats.mean:.1f}")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="the embedded upstream's model")
    parser.add_argument("--questions", type=int, help="distinct questions asked")
    parser.add_argument("--max-tokens", type=int, default=32, help="answer length asked for")
    args = apply_defaults(parser.parse_args(), {"model": "builtin:tiny", "questions": 40},
                          {"model": "builtin:tiny", "questions": 8})
    questions = sample(qqp_questions(load_qqp(args.data_dir, "dev")), args.questions, args.seed)
    data = args.cache_dir / "proxy-bench"
    shutil.rmtree(data / "proxy", ignore_errors=True)  # every run starts with empty caches
    note(f"starting the upstream ({args.model}) and the proxy; {machine_load()}")
    # builtin:gemma-3-270m is converted once into the user's data dir (MEANCACHE_DATA_DIR)
    with BackgroundServer(args.model, ServerSettings(api_key="bench"),
                          data_dir=load_settings().data_dir) as upstream:
        settings = load_settings(data / "config", data, environ={}, encoder_model="minilm",
                                 upstream_url=upstream.url, upstream_api_key="bench",
                                 answer_max_tokens=args.max_tokens)
        proxy = Proxy.open(settings)
        try:
            measure(proxy, upstream.url, questions, args.max_tokens)
        finally:
            proxy.close()


def measure(proxy: Proxy, upstream_url: str, questions: list[str], max_tokens: int) -> None:
    model = proxy.state.model
    app = openai.OpenAI(base_url=proxy.start(), api_key="bench-app", max_retries=0)
    direct = openai.OpenAI(base_url=f"{upstream_url}/v1", api_key="bench", max_retries=0)
    warm = "A warm-up question that is not one of the measured ones?"
    streamed(direct, model, warm, max_tokens)
    streamed(app, model, warm, None)
    straight, missed, miss_totals, straight_totals = [], [], [], []
    hit_first, hit_totals, hit_whole, headers = [], [], [], []
    for i, question in enumerate(questions):
        paths: list[Callable[[], tuple[float, float, str]]] = [
            lambda q=question: streamed(direct, model, q, max_tokens),
            lambda q=question: streamed(app, model, q, None)]
        results = [path() for path in (paths if i % 2 == 0 else paths[::-1])]
        (direct_first, direct_total, _), (first, total, header) = \
            results if i % 2 == 0 else results[::-1]
        straight.append(direct_first)
        straight_totals.append(direct_total)
        missed.append(first)
        miss_totals.append(total)
        headers.append(header)
        first, total, header = streamed(app, model, question, None)
        hit_first.append(first)
        hit_totals.append(total)
        headers.append(header)
        seconds, header = whole(app, model, question)
        hit_whole.append(seconds)
        headers.append(header)
        note(f"{i + 1}/{len(questions)}")
    misses = headers[0::3]
    hits = [h for h in headers[1::3] + headers[2::3] if h.startswith("hit")]
    heading(f"`meancache proxy` overhead: {len(questions)} QQP dev questions, upstream "
            f"{model} (embedded, loopback), {max_tokens}-token greedy answers; openai SDK; "
            f"{machine_load()}")
    table = make_table(["path", "n", "p50 ms", "p90 ms", "mean ms"])
    row(table, "straight to the upstream: first token", straight)
    row(table, "proxy, miss: first token", missed)
    row(table, "proxy, miss - straight (paired): first token",
        [m - s for m, s in zip(missed, straight, strict=True)])
    row(table, "straight to the upstream: whole answer", straight_totals)
    row(table, "proxy, miss: whole answer", miss_totals)
    row(table, "proxy, hit (streamed): first token", hit_first)
    row(table, "proxy, hit (streamed): whole answer", hit_totals)
    row(table, "proxy, hit (not streamed): whole answer", hit_whole)
    print_table(table)
    ratio = statistics.median(m / s for m, s in zip(missed, straight, strict=True))
    saving = statistics.median(s / h for s, h in zip(straight_totals, hit_totals, strict=True))
    print(f"misses marked miss: {misses.count('miss')}/{len(misses)}; hits marked hit: "
          f"{len(hits)}/{2 * len(questions)}")
    print(f"median paired ratio, miss first token through the proxy / straight: {ratio:.2f}")
    print(f"median paired ratio, whole answer straight / streamed hit: {saving:.1f}x")
    print_command()


if __name__ == "__main__":
    main()
