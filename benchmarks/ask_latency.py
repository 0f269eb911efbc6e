"""`meancache ask` as a script calls it: a new process per question, against the one model
call a question costs, and a cached answer against none.

Runs the real command on an app data dir (``--app-dir``, default ``<cache-dir>/ask-app``,
kept between runs so that the encoder and the model are assembled once; the first run of
the benchmark there takes minutes):

1. ``meancache upstream stop``, then one ``ask``: the cold start, which starts the background
   upstream that later ``ask`` runs reuse.
2. For each of ``--questions`` short Chatbot Arena first turns (any split: this measures
   time, not answers):
   - ``meancache ask --json Q``: a miss, answered by the upstream and then cached;
   - the same request sent straight to that background server with the official
     ``openai`` SDK, in this process: one model call (the messages, ``max_tokens`` and
     temperature the app sends; the server's default repetition guard applies to both).
     Which of the two goes first alternates from question to question;
   - ``meancache ask --json Q`` again: an exact cache hit, no model call.

The table gives the median and largest wall time of each, and the median of each
question's ask minus its own model call: what the command costs beyond the model.

    python benchmarks/ask_latency.py                 # 8 questions, default MPNet + Gemma
    python benchmarks/ask_latency.py --quick         # 3 questions
"""

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

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
from meancache.client.upstream_client import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE
from meancache.shared.running_upstream import registered
from meancache.upstream.pack.data import read_instructions
from openai import OpenAI

MAX_QUESTION_CHARS = 80  # short questions keep the answers, and the run, short


@dataclass(frozen=True)
class Asked:
    seconds: float
    source: str
    tokens: int | None = None


def meancache(app_dir: Path, *args: str) -> tuple[float, str]:
    """Wall seconds and stdout of one ``meancache`` command in a new process."""
    env = {**os.environ, "MEANCACHE_DATA_DIR": str(app_dir),
           "MEANCACHE_CONFIG_DIR": str(app_dir / "config")}
    executable = shutil.which("meancache", path=str(Path(sys.executable).parent))
    start = time.perf_counter()
    done = subprocess.run([executable or "meancache", *args], env=env, capture_output=True,
                          text=True, timeout=900)
    seconds = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"meancache {' '.join(args)} failed ({done.returncode}):\n"
                         f"{done.stderr[-2000:]}")
    return seconds, done.stdout


def ask(app_dir: Path, question: str) -> Asked:
    seconds, out = meancache(app_dir, "ask", "--json", question)
    return Asked(seconds, json.loads(out.splitlines()[-1])["source"])


def model_call(client: OpenAI, model: str, question: str) -> Asked:
    """The request ``ask`` makes for ``question``, streamed to its end."""
    start = time.perf_counter()
    stream = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": question}],
        max_tokens=DEFAULT_MAX_TOKENS, temperature=DEFAULT_TEMPERATURE, stream=True,
        stream_options={"include_usage": True})
    tokens = None
    for chunk in stream:
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
    return Asked(time.perf_counter() - start, "model call", tokens)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--app-dir", type=Path, default=None,
                        help="the app's data dir (default: <cache-dir>/ask-app)")
    parser.add_argument("--questions", type=int, default=None,
                        help="questions asked (default 8, --quick 3)")
    args = apply_defaults(parser.parse_args(), {"questions": 8}, {"questions": 3})
    app_dir = args.app_dir or args.cache_dir / "ask-app"
    app_dir.mkdir(parents=True, exist_ok=True)
    arena = read_instructions(args.data_dir / "instructions" / "arena_first_turns.jsonl")
    short = [q for q in dict.fromkeys(arena) if len(q) <= MAX_QUESTION_CHARS and "\n" not in q]
    questions = short[args.seed * args.questions:(args.seed + 1) * args.questions]
    note(f"app dir {app_dir}; machine load {machine_load()}")

    meancache(app_dir, "upstream", "stop")
    note("cold ask (starts the background upstream; the first run here assembles models)")
    cold = ask(app_dir, "What is the capital of France?")
    running = registered(app_dir)
    if running is None:
        raise SystemExit("the cold ask left no background upstream registered")
    client = OpenAI(base_url=running.url.rstrip("/") + "/v1", api_key=running.api_key or "-")

    misses: list[Asked] = []
    calls: list[Asked] = []
    hits: list[Asked] = []
    for i, question in enumerate(questions):
        note(f"[{i + 1}/{len(questions)}] {question}")
        if i % 2:
            calls.append(model_call(client, running.model, question))
            misses.append(ask(app_dir, question))
        else:
            misses.append(ask(app_dir, question))
            calls.append(model_call(client, running.model, question))
        hits.append(ask(app_dir, question))
    meancache(app_dir, "upstream", "stop")

    heading(f"meancache ask, {len(questions)} questions (a new process each), "
            f"model {running.model}; load {machine_load()}")
    table = make_table(["run", "n", "median s", "max s", "answered by"])
    table.add_row("first ask (starts the upstream)", "1", f"{cold.seconds:.2f}",
                  f"{cold.seconds:.2f}", cold.source)
    for label, runs in (("ask, a miss", misses), ("its model call alone (openai SDK)", calls),
                        ("ask again, a cache hit", hits)):
        seconds = [r.seconds for r in runs]
        sources = ", ".join(f"{s} {n}" for s, n in sorted(
            {s: sum(r.source == s for r in runs) for s in {r.source for r in runs}}.items()))
        table.add_row(label, str(len(runs)), f"{statistics.median(seconds):.2f}",
                      f"{max(seconds):.2f}", sources)
    print_table(table)
    beyond = [m.seconds - c.seconds for m, c in zip(misses, calls, strict=True)]
    tokens = [c.tokens for c in calls if c.tokens is not None]
    print(f"ask beyond its model call: median {statistics.median(beyond):.2f} s "
          f"(max {max(beyond):.2f} s); answers of median {statistics.median(tokens)} tokens")
    print_command()


if __name__ == "__main__":
    main()
