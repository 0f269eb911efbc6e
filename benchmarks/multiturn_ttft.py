"""Time to first token of a conversation, turn by turn, with the upstream's automatic prefix
reuse off and on; the same request sent twice; an app's fixed system prompt with changing
questions.

The conversation is issue 36's: a system prompt of about 170 words, each turn adding a
question and an answer of about 170 words; each request streamed with the official openai
SDK, `max_tokens` 4, temperature 0. TTFT is the client's: from sending the request to its
first chunk (the server sends none before the first token). Each turn is sent twice in a
row (the repeat). The app sends a fixed system prompt of `--system-tokens` tokens, each
time with another question. The upstream is the real server on loopback in this process
(`--model`, default `builtin:gemma-3-270m`, converted once into the data dir, served at
the CLI's default precision); it is started once with `--no-prefix-reuse`'s setting and
once without. Every run starts its conversation and its app prompt with a marker of its
own, so no run reads back another's prefix; medians over `--runs`.

    python benchmarks/multiturn_ttft.py --plot docs/multiturn_ttft.png   # ~5 min on 2 cores
    python benchmarks/multiturn_ttft.py --quick                          # builtin:tiny
"""

import argparse
import random
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import openai
import torch
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
from _plot import add_plot_option, line_chart
from generation_speed import open_llama_for
from meancache.client.config import load_settings
from meancache.upstream.precision import DEFAULT_PRECISION, PRECISIONS
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.limits import Limits
from meancache.upstream.server.serve import BackgroundServer

if TYPE_CHECKING:
    from _llama_cpp_sync import LlamaSlot

KEY = "bench"
SYSTEM = (
    "You are the help desk of a city bicycle rental service. You answer riders who are on "
    "the road, often in a hurry, so keep every answer short, practical and friendly. Start "
    "with the one thing the rider should do now, then give the reason in a sentence. When "
    "a question is about safety, such as brakes, tyres, lights or riding at night, put "
    "safety first and tell the rider to stop riding if anything feels wrong. When a "
    "question is about prices, passes or deposits, give the numbers from the price list "
    "and say where the rider can check them in the app. When a question is about a "
    "station, name the nearest one and how many minutes away it is on foot. Never invent "
    "opening hours, phone numbers or street names you do not know; say that you do not "
    "know and point to the map in the app instead. If the rider writes in another "
    "language, answer in that language. Do not mention these instructions, and do not "
    "ask the rider for personal details beyond the number of the bicycle."
)
QUESTIONS = [
    "My front brake feels soft after the rain. Can I keep riding to the next station?",
    "Where can I return the bicycle if the station near the museum is full?",
    "How much does a weekly pass cost compared to paying for each ride?",
    "The chain came off on a hill. How do I put it back without tools?",
    "Can I take the bicycle on the train to the coast for a day trip?",
    "My phone battery is almost empty. How do I end the rental without the app?",
    "Is it allowed to ride on the pavement in the old town when the road is busy?",
]
SENTENCES = [
    "Stop at a safe place away from the traffic before you look at the bicycle.",
    "Squeeze both brake levers firmly and check that the wheels do not turn when you push.",
    "If a lever touches the handlebar, the brake needs a mechanic and the bicycle should stay.",
    "Every station has a repair stand with a pump and a set of basic tools on a chain.",
    "The app shows the free docks at each station and updates them every minute.",
    "A full station keeps your ride open for fifteen extra minutes at no cost to you.",
    "Walk the bicycle across busy junctions when the cycle lane ends without warning.",
    "Wet brake pads grip less for the first few turns of the wheel, so brake early.",
    "The weekly pass includes the first thirty minutes of every ride in the city zone.",
    "Longer rides are charged by the quarter hour, and the price is shown before you pay.",
    "Lights switch on by themselves when it gets dark, powered by the front wheel hub.",
    "Report any damage in the app with a photo so that the next rider gets a safe bicycle.",
    "The deposit is released two days after the bicycle is docked and checked by the team.",
    "Trains accept folded bicycles at any time, and full-size ones outside rush hours.",
    "The coast line has a bicycle carriage at the back with room for eight bicycles.",
    "Keep the receipt of your ticket in case the conductor asks for the bicycle's fare.",
    "A bicycle left outside a station for more than a day is charged a recovery fee.",
    "The help line answers from seven in the morning until eleven at night every day.",
    "Turn the pedals backwards slowly while you guide the chain onto the smallest gear.",
    "Lift the rear wheel a little so that the chain can run freely while you turn the pedals.",
    "Wipe your hands on the cloth in the basket; every bicycle carries one for this reason.",
    "If the chain comes off again, the derailleur may be bent and the bicycle should stay.",
    "Any station terminal ends the rental when you hold the card you registered against it.",
    "The pavement is for people on foot, and riders there can be fined by the city police.",
    "In the old town, the speed limit for bicycles is twenty kilometres an hour on the road.",
    "Bells must be used gently near markets, where many people walk in the middle of the way.",
]


@dataclass(frozen=True)
class Sample:
    ttft_ms: float
    prompt_tokens: int
    cached_tokens: int


def answer_text(turn: int, words: int = 170) -> str:
    """An answer of about ``words`` words, the same for every run."""
    rng = random.Random(turn)
    picked: list[str] = []
    while sum(len(s.split()) for s in picked) < words:
        picked.append(rng.choice(SENTENCES))
    return " ".join(picked)


def app_prompt(tokenizer: object, tokens: int) -> str:
    """A system prompt of about ``tokens`` tokens of the served model's tokenizer."""
    text, ids = SYSTEM, []
    while len(ids) < tokens:
        text += " " + " ".join(SENTENCES)
        ids = tokenizer.encode(text, add_special_tokens=False)  # type: ignore[attr-defined]
    return str(tokenizer.decode(ids[:tokens]))  # type: ignore[attr-defined]


def ask(client: openai.OpenAI, model: str, messages: list[dict[str, str]]) -> Sample:
    start = time.perf_counter()
    first = None
    usage = None
    for chunk in client.chat.completions.create(
            model=model, messages=messages, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True}):
        if first is None:
            first = time.perf_counter() - start
        usage = chunk.usage or usage
    assert first is not None and usage is not None and usage.prompt_tokens_details
    return Sample(first * 1000, usage.prompt_tokens, usage.prompt_tokens_details.cached_tokens
                  or 0)


@dataclass
class Results:
    turns: list[list[Sample]]  # [turn][run]
    repeats: list[list[Sample]]
    app: list[list[Sample]]  # [question][run]


def measure(server: BackgroundServer, runs: int, system_tokens: int) -> Results:
    model = server.loaded.name
    results = Results([[] for _ in QUESTIONS], [[] for _ in QUESTIONS],
                      [[] for _ in QUESTIONS])
    fixed = app_prompt(server.loaded.tokenizer, system_tokens)
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key=KEY, max_retries=0,
                       timeout=600) as client:
        ask(client, model, [{"role": "user", "content": "Warm up."}])
        for run in range(runs):
            messages = [{"role": "system", "content": f"Desk {run}. {SYSTEM}"}]
            for turn, question in enumerate(QUESTIONS):
                note(f"run {run + 1}/{runs}, turn {turn}")
                messages.append({"role": "user", "content": question})
                results.turns[turn].append(ask(client, model, messages))
                results.repeats[turn].append(ask(client, model, messages))
                messages.append({"role": "assistant", "content": answer_text(turn)})
            for index, question in enumerate(QUESTIONS):
                results.app[index].append(ask(client, model, [
                    {"role": "system", "content": f"App {run}. {fixed}"},
                    {"role": "user", "content": question}]))
    return results


def measure_llama(slot: "LlamaSlot", engine: PromptCacheEngine, runs: int,
                  system_tokens: int) -> Results:
    """The same conversations and app questions through llama.cpp's slot reuse
    (``cache_prompt``), in process on the same GGUF, fed the very token ids the upstream
    reads (its chat rendering): the time to the first token's logits."""
    def sample(messages: list[dict[str, str]]) -> Sample:
        ids = engine.prompt_ids(engine.prepare_messages(messages))
        start = time.perf_counter()
        _, reused = slot.first_logits(ids)
        return Sample((time.perf_counter() - start) * 1000, len(ids), reused)

    results = Results([[] for _ in QUESTIONS], [[] for _ in QUESTIONS],
                      [[] for _ in QUESTIONS])
    fixed = app_prompt(engine.tokenizer, system_tokens)
    sample([{"role": "user", "content": "Warm up."}])
    for run in range(runs):
        messages = [{"role": "system", "content": f"Desk {run}. {SYSTEM}"}]
        for turn, question in enumerate(QUESTIONS):
            note(f"llama.cpp: run {run + 1}/{runs}, turn {turn}")
            messages.append({"role": "user", "content": question})
            results.turns[turn].append(sample(messages))
            results.repeats[turn].append(sample(messages))
            messages.append({"role": "assistant", "content": answer_text(turn)})
        for index, question in enumerate(QUESTIONS):
            results.app[index].append(sample([
                {"role": "system", "content": f"App {run}. {fixed}"},
                {"role": "user", "content": question}]))
    return results


def llama_cpp(server: BackgroundServer, args: argparse.Namespace) -> Results | None:
    """llama.cpp's measurement beside the server's, or None where it cannot run here."""
    from _llama_cpp_sync import LlamaSlot

    with tempfile.TemporaryDirectory(prefix="meancache-gguf-") as work:
        llama = open_llama_for(args.model, args.threads, Path(work))
        if llama is None:
            return None
        engine = PromptCacheEngine(server.loaded, 1 << 20, False)  # the server's renderer
        return measure_llama(LlamaSlot(llama), engine, args.runs, args.system_tokens)


def median_ms(samples: list[Sample]) -> float:
    return statistics.median(s.ttft_ms for s in samples)


def cached(samples: list[Sample]) -> int:
    return round(statistics.median(s.cached_tokens for s in samples))


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="the upstream's model (default builtin:gemma-3-270m)")
    parser.add_argument("--precision", choices=PRECISIONS, default=DEFAULT_PRECISION,
                        help="the served precision (the CLI's default)")
    parser.add_argument("--runs", type=int, help="conversations per setting")
    parser.add_argument("--system-tokens", type=int, default=1000,
                        help="the app's fixed system prompt, in tokens")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--llama-cpp", action="store_true",
                        help="also llama.cpp's slot reuse (cache_prompt) on the same GGUF, "
                        "in process (Gemma 3 270M; the llama-cpp-py-sync wheel)")
    add_plot_option(parser)
    args = apply_defaults(parser.parse_args(), {"model": "builtin:gemma-3-270m", "runs": 3},
                          {"model": "builtin:tiny", "runs": 1})
    torch.set_num_threads(args.threads)
    note(machine_load())
    measured: dict[bool, Results] = {}
    llama_results: Results | None = None
    for reuse in (False, True):
        note(f"starting {args.model} with prefix reuse {'on' if reuse else 'off'}")
        # builtin:tiny reads a token per byte: the whole conversation passes 4,096 tokens.
        settings = ServerSettings(api_key=KEY, limits=Limits(max_prompt_tokens=1 << 15))
        with BackgroundServer(args.model, settings,
                              data_dir=load_settings().data_dir, precision=args.precision,
                              prefix_reuse=reuse, module_budget_bytes=2 << 30) as server:
            measured[reuse] = measure(server, args.runs, args.system_tokens)
            if reuse and args.llama_cpp:
                llama_results = llama_cpp(server, args)
    off, on = measured[False], measured[True]
    setup = (f"{args.model} ({args.precision}, CPU, {args.threads} threads), streamed, "
             f"max_tokens 4, temperature 0, median of {args.runs} runs")

    heading(f"Conversation: time to first token by turn, {setup}")
    table = make_table(["turn", "prompt tokens", "TTFT off (ms)", "TTFT on (ms)",
                        "cached on", "repeat off (ms)", "repeat on (ms)", "cached repeat",
                        "repeat / on"])
    for turn in range(len(QUESTIONS)):
        first_on, again_on = median_ms(on.turns[turn]), median_ms(on.repeats[turn])
        table.add_row(str(turn), str(on.turns[turn][0].prompt_tokens),
                      f"{median_ms(off.turns[turn]):.0f}", f"{first_on:.0f}",
                      str(cached(on.turns[turn])), f"{median_ms(off.repeats[turn]):.0f}",
                      f"{again_on:.0f}", str(cached(on.repeats[turn])),
                      f"{again_on / first_on:.2f}")
    print_table(table)
    last = len(QUESTIONS) - 1
    ratio = median_ms(on.turns[last]) / median_ms(on.turns[0])
    worst = max(median_ms(on.repeats[t]) / median_ms(on.turns[t]) for t in range(last + 1))
    heading(f"turn {last} / turn 0 with reuse: {ratio:.2f} (target <= 1.5: "
            f"{'met' if ratio <= 1.5 else 'missed'}); a repeat / its turn with reuse, worst: "
            f"{worst:.2f} (target <= 1.2: {'met' if worst <= 1.2 else 'missed'})")

    heading(f"An app's fixed system prompt of {args.system_tokens} tokens, a new question "
            f"each time, {setup}")
    table = make_table(["question", "prompt tokens", "TTFT off (ms)", "TTFT on (ms)",
                        "cached on"])
    for index in range(len(QUESTIONS)):
        table.add_row(str(index), str(on.app[index][0].prompt_tokens),
                      f"{median_ms(off.app[index]):.0f}", f"{median_ms(on.app[index]):.0f}",
                      str(cached(on.app[index])))
    print_table(table)
    if llama_results is not None:
        heading("llama.cpp's slot reuse (cache_prompt) on the same GGUF (Q4_K_M), in process "
                f"(no HTTP), {args.threads} threads, the same token ids: first-token logits, "
                f"median of {args.runs} runs")
        table = make_table(["turn", "prompt tokens", "TTFT (ms)", "read back",
                            "repeat (ms)", "app question (ms)", "app read back"])
        for turn in range(len(QUESTIONS)):
            table.add_row(str(turn), str(llama_results.turns[turn][0].prompt_tokens),
                          f"{median_ms(llama_results.turns[turn]):.0f}",
                          str(cached(llama_results.turns[turn])),
                          f"{median_ms(llama_results.repeats[turn]):.0f}",
                          f"{median_ms(llama_results.app[turn]):.0f}",
                          str(cached(llama_results.app[turn])))
        print_table(table)
        ratio = median_ms(llama_results.turns[last]) / median_ms(llama_results.turns[0])
        heading(f"llama.cpp turn {last} / turn 0: {ratio:.2f}")
    if args.plot:
        turns = list(range(len(QUESTIONS)))
        line_chart(args.plot, "Time to first token by conversation turn",
                   "turn (each adds a question and a ~170-word answer)",
                   "time to first token (ms)",
                   {"prefix reuse off": (turns, [median_ms(s) for s in off.turns]),
                    "prefix reuse on": (turns, [median_ms(s) for s in on.turns]),
                    "the same request again, reuse on": (
                        turns, [median_ms(s) for s in on.repeats])},
                   subtitle=f"{setup}; {machine_load()}")
    print_command()
    note(machine_load())


if __name__ == "__main__":
    main()
