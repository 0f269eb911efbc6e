"""One greedy tenant against another's first token, and the server's memory under big
inputs (issue 26): `meancache upstream serve` in a process of its own on loopback, with two
API keys.

The greedy key keeps its queue full (--greedy-clients streams of --greedy-tokens tokens,
back to back; 429s when its per-key queue is full are part of the load). The other key asks
short streamed questions one after another; its time to first token (the first content
chunk) is measured alone and under the load. The bound the server promises: keys take turns
on the model thread and a request is one job there (its prompt prepared, then generated),
so the other key's request waits for at most the one greedy request running now: its TTFT
under load stays within its TTFT alone plus one greedy request (the longest measured while
the flood runs: on a shared CPU every request slows down under load), however many the
greedy key sends. A FIFO queue would put all of its queued requests first.

Then a burst of big inputs (bodies just over the cap, 15 KiB headers, deep JSON, a PML
schema of 600 modules) and the process's peak RSS.

    python benchmarks/tenant_fairness.py            # builtin:tiny, 40 questions
    python benchmarks/tenant_fairness.py --quick    # 12 questions
"""

import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
from _common import (
    apply_defaults,
    base_parser,
    heading,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
)
from meancache.shared.pml import PML_MEDIA_TYPE
from meancache.shared.processes import free_port

GREEDY, OTHER = "key-greedy", "key-other"


def stream_ttft(client: httpx.Client, max_tokens: int) -> tuple[float, float] | None:
    """(seconds to the first content chunk, seconds to the end), or None if refused."""
    body = {"messages": [{"role": "user", "content": "Tell me about the sea."}],
            "max_tokens": max_tokens, "stream": True, "temperature": 0}
    start = time.perf_counter()
    first = None
    with client.stream("POST", "/v1/chat/completions", json=body) as response:
        if response.status_code != 200:
            response.read()
            return None
        for line in response.iter_lines():
            if first is None and line.startswith("data: {"):
                choices = json.loads(line[6:]).get("choices") or [{}]
                if choices[0].get("delta", {}).get("content"):
                    first = time.perf_counter() - start
    return (first if first is not None else time.perf_counter() - start,
            time.perf_counter() - start)


def fairness(url: str, questions: int, greedy_clients: int, greedy_tokens: int
             ) -> dict[str, Any]:
    def client(key: str) -> httpx.Client:
        return httpx.Client(base_url=url, timeout=300, headers={"Authorization": f"Bearer {key}"})

    other, greedy = client(OTHER), client(GREEDY)
    for _ in range(2):  # warm-up
        stream_ttft(other, 4)
    alone = [r[0] for r in (stream_ttft(other, 4) for _ in range(questions)) if r]
    greedy_alone = [r[1] for r in (stream_ttft(greedy, greedy_tokens) for _ in range(3)) if r]
    stop = threading.Event()
    counts = {"served": 0, "refused": 0}
    greedy_loaded: list[float] = []

    def flood() -> None:
        with client(GREEDY) as mine:
            while not stop.is_set():
                result = stream_ttft(mine, greedy_tokens)
                counts["served" if result else "refused"] += 1
                if result is None:
                    time.sleep(0.01)
                else:
                    greedy_loaded.append(result[1] - result[0])  # its job, less its wait

    threads = [threading.Thread(target=flood, daemon=True) for _ in range(greedy_clients)]
    for thread in threads:
        thread.start()
    time.sleep(max(greedy_alone) * 2)  # its queue fills
    loaded = [r[0] for r in (stream_ttft(other, 4) for _ in range(questions)) if r]
    stop.set()
    for thread in threads:
        thread.join(timeout=300)
    return {"alone": alone, "loaded": loaded, "greedy_alone": greedy_alone,
            "greedy_loaded": greedy_loaded, **counts}


def big_inputs(url: str, rounds: int) -> dict[str, int]:
    """Status counts of a burst of big and odd inputs."""
    statuses: dict[str, int] = {}
    headers = {"Authorization": f"Bearer {GREEDY}"}
    deep = "[" * 31 + "]" * 31
    schema = "<schema name=\"big\">" + "".join(
        f"<module name=\"m{i}\">x</module>" for i in range(600)) + "</schema>"
    cases = [
        ("post", "/v1/chat/completions", {"content": b"{" + b" " * (4 * 2**20 + 1) + b"}",
                                          "headers": {"Content-Type": "application/json"}}),
        ("post", "/v1/chat/completions", {"content": json.dumps(
            {"messages": [{"role": "user", "content": "x" * 60_000}], "max_tokens": 1}),
            "headers": {"Content-Type": "application/json"}}),
        ("post", "/v1/chat/completions", {"content": f'{{"messages": {deep}}}',
                                          "headers": {"Content-Type": "application/json"}}),
        ("get", "/health", {"headers": {"X-Big": "a" * 15_000}}),
        ("post", "/v1/schemas", {"content": schema,
                                 "headers": {"Content-Type": PML_MEDIA_TYPE}}),
    ]
    with httpx.Client(base_url=url, timeout=120, headers=headers) as http:
        for _ in range(rounds):
            for method, path, kwargs in cases:
                try:
                    status = str(getattr(http, method)(path, **kwargs).status_code)
                except httpx.HTTPError as exc:
                    status = type(exc).__name__
                statuses[status] = statuses.get(status, 0) + 1
    return statuses


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", default="builtin:tiny")
    parser.add_argument("--questions", type=int, help="the other key's questions per phase")
    parser.add_argument("--greedy-clients", type=int, default=8)
    parser.add_argument("--greedy-tokens", type=int, default=128)
    parser.add_argument("--big-rounds", type=int, help="rounds of the big-input cases")
    args = apply_defaults(parser.parse_args(), {"questions": 40, "big_rounds": 20},
                          {"questions": 12, "big_rounds": 4})
    print_command()
    print(machine_load())
    port = free_port()
    env = {**os.environ, "MEANCACHE_DATA_DIR": str(args.cache_dir / "fairness")}
    log = Path(args.cache_dir / "fairness-server.log")
    log.parent.mkdir(parents=True, exist_ok=True)
    served = subprocess.Popen(
        [sys.executable, "-m", "meancache", "upstream", "serve", "--model", args.model,
         "--port", str(port), "--api-key", GREEDY, "--api-key", OTHER],
        env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    process = psutil.Process(served.pid)
    try:
        for _ in range(600):
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.2)
        note("fairness: the other key alone, then under the greedy key's load")
        result = fairness(url, args.questions, args.greedy_clients, args.greedy_tokens)
        rss_before = process.memory_info().rss
        peak = [rss_before]
        done = threading.Event()

        def sample() -> None:
            while not done.is_set():
                peak[0] = max(peak[0], process.memory_info().rss)
                time.sleep(0.01)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        note("big inputs")
        statuses = big_inputs(url, args.big_rounds)
        done.set()
        sampler.join()
    finally:
        served.terminate()
        served.wait(timeout=60)
    alone, loaded, greedy = result["alone"], result["loaded"], result["greedy_loaded"]
    # One greedy request = its prefill (the same prompt as the other key's: at most the
    # other's TTFT alone) + its generation (first token to last, measured under the flood).
    bound = 2 * max(alone) + max(greedy)
    table = make_table(["the other key's TTFT (ms)", "n", "p50", "p95", "max"])
    for name, values in (("alone", alone), ("greedy key flooding", loaded)):
        ordered = sorted(values)
        table.add_row(name, str(len(values)), f"{statistics.median(values) * 1000:.0f}",
                      f"{ordered[int(0.95 * (len(ordered) - 1))] * 1000:.0f}",
                      f"{ordered[-1] * 1000:.0f}")
    heading(f"Fairness ({args.model}; greedy: {args.greedy_clients} streams of "
            f"{args.greedy_tokens} tokens, {result['served']} served, {result['refused']} "
            "refused with 429 while it ran)")
    print_table(table)
    print(f"one greedy request: {max(result['greedy_alone']) * 1000:.0f} ms alone, up to "
          f"{max(greedy) * 1000:.0f} ms (first token to last) while the flood ran; "
          f"bound = max TTFT alone + 1 greedy request = {bound * 1000:.0f} ms; max under load "
          f"{max(loaded) * 1000:.0f} ms: {'within' if max(loaded) <= bound else 'OVER'} the "
          f"bound (a FIFO queue of {args.greedy_clients} greedy jobs would put up to "
          f"{args.greedy_clients * max(greedy) * 1000:.0f} ms before it)")
    heading(f"Big inputs ({args.big_rounds} rounds of 5 cases)")
    table = make_table(["status", "count"])
    for status, count in sorted(statuses.items()):
        table.add_row(status, str(count))
    print_table(table)
    print(f"RSS before {rss_before / 2**20:.0f} MiB, peak during {peak[0] / 2**20:.0f} MiB "
          f"(+{(peak[0] - rss_before) / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
