"""Generation speed of the embedded model: time to first token and decode tokens/s per
precision, their next-token agreement with float32, and llama.cpp on the same GGUF.

Speed: short chat questions (Arena first turns, cut to --question-chars), rendered with
the model's chat template and answered greedily through the Prompt Cache engine, as the
server answers them (KV cache on); decode tokens/s counts the tokens after the first over
the time after it. Each precision runs the same questions after one warm-up; medians.

Agreement: for --prompts instructions (ShareGPT first turns), the model's top-1 next token
per precision against float32's (target >= 98%): after the rendered prompt, and after each
of --steps decode steps that read float32's greedy tokens (so both predict after the same
text). int8 reads prompts in float32, so its first token is float32's by construction;
its decode steps are what int8 changes. int4 reads prompts as fp16-int8 and decodes on
4-bit weights through ONNX Runtime (upstream.onnx_decode): it is not float32-equivalent,
so its decode-step agreement is reported, not promised.

llama.cpp: when the prebuilt wheel llama-cpp-py-sync loads (pip install llama-cpp-py-sync;
its libraries need glibc 2.38), the same questions on the packaged Q4_K_M GGUF with the
same thread count, reading the engine's own prompt token ids, greedy, stopping where the
engine stops; its top-1 agreement with float32 as above. Every runtime answers each
question in turn (A B A B ...), so the machine's drift falls on all alike. (This replaces
the column that needed llama-cpp-python compiled from source.) On a shared machine run it
with OMP_WAIT_POLICY=passive: llama.cpp's OpenMP threads otherwise spin while they wait and
decoded 10 times slower under load.

    python benchmarks/generation_speed.py                  # Gemma 3 270M, float32 and int8
    python benchmarks/generation_speed.py --quick          # builtin:tiny-gemma3, a few prompts
"""

import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

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
from meancache.upstream.model_loading import load_model
from meancache.upstream.precision import AUTO, PRECISIONS
from meancache.upstream.prompt_cache.engine import Finish, PromptCacheEngine
from meancache.upstream.sampling import SamplingParams, TextStream

if TYPE_CHECKING:
    from _llama_cpp_sync import LlamaSession

LLAMA = "llama.cpp Q4_K_M (llama-cpp-py-sync)"


@dataclass(frozen=True)
class Speed:
    ttft_ms: float
    tokens_per_s: float
    tokens: int  # median completion tokens per question


def instructions(path: Path, n: int, chars: int) -> list[str]:
    texts = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            text = " ".join(json.loads(line)["text"].split())
            if 10 <= len(text) <= chars:
                texts.append(text)
            if len(texts) == n:
                break
    return texts


Answer = tuple[float, float, int] | None  # TTFT ms, decode tokens/s, tokens; None: too short


def engine_answer(engine: PromptCacheEngine, question: str, max_tokens: int) -> Answer:
    """One greedy answer, as the server produces it."""
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    prepared = engine.prepare_messages([{"role": "user", "content": question}])
    start = time.perf_counter()
    finish = None
    for event in engine.generate(prepared, params):
        if isinstance(event, Finish):
            finish = event
    end = time.perf_counter()
    if finish is None or finish.completion_tokens < 2:
        return None
    return (finish.ttft_seconds * 1000,
            (finish.completion_tokens - 1) / (end - start - finish.ttft_seconds),
            finish.completion_tokens)


def llama_answer(llama: "LlamaSession", engine: PromptCacheEngine, question: str,
                 max_tokens: int) -> Answer:
    """The same answer from llama.cpp: the engine's prompt token ids, greedy, and the same
    end-of-sequence ids and stop strings (the engine's loop guard aside)."""
    prepared = engine.prepare_messages([{"role": "user", "content": question}])
    ids = engine.prompt_ids(prepared)
    stream = TextStream(engine.tokenizer, engine.loaded.stop)
    start = time.perf_counter()
    token = int(llama.prefill(ids).argmax())
    ttft = time.perf_counter() - start
    produced, position = 1, len(ids)
    while token not in engine._eos and produced < max_tokens:
        stream.push(token)
        if stream.stopped:
            break
        token = int(llama.step(token, position).argmax())
        position += 1
        produced += 1
    end = time.perf_counter()
    if produced < 2:
        return None
    return ttft * 1000, (produced - 1) / (end - start - ttft), produced


def interleaved(runners: dict[str, Callable[[str], Answer]], questions: Sequence[str]
                ) -> dict[str, Speed]:
    """Each question answered by every runtime in turn (A B A B ...), so that the machine's
    drift falls on all alike; the first question is a warm-up; medians."""
    answers: dict[str, list[tuple[float, float, int]]] = {name: [] for name in runners}
    for i, question in enumerate([questions[0], *questions]):
        for name, run in runners.items():
            answer = run(question)
            if i > 0 and answer is not None:
                answers[name].append(answer)
    return {name: Speed(statistics.median(a[0] for a in rows),
                        statistics.median(a[1] for a in rows),
                        int(statistics.median(a[2] for a in rows)))
            for name, rows in answers.items() if rows}


def predictions(engine: PromptCacheEngine, prompts: Sequence[str], steps: int,
                forced: Sequence[Sequence[int]] | None = None) -> list[list[int]]:
    """Per prompt, the top-1 token after the prompt, then after each of ``steps`` decode
    steps. With ``forced`` (float32's predictions), each step reads float32's token rather
    than its own, so every prediction is compared after the same text."""
    out = []
    for i, prompt in enumerate(prompts):
        prepared = engine.prepare_messages([{"role": "user", "content": prompt}])
        logits, seen, cache = engine.prefill(prepared)
        predicted = [int(logits.argmax())]
        position = max(prepared.new_positions)
        for step in range(steps):
            position += 1
            token = forced[i][step] if forced is not None else predicted[-1]
            logits, seen = engine.decode_step(token, position, seen, cache)
            predicted.append(int(logits.argmax()))
        out.append(predicted)
    return out


def agreement(ours: Sequence[Sequence[int]], reference: Sequence[Sequence[int]]
              ) -> tuple[float, float]:
    """Share of equal predictions: after the prompt, and over the decode steps."""
    first = sum(a[0] == b[0] for a, b in zip(ours, reference, strict=True)) / len(reference)
    pairs = [(x, y) for a, b in zip(ours, reference, strict=True)
             for x, y in zip(a[1:], b[1:], strict=True)]
    return first, sum(x == y for x, y in pairs) / max(len(pairs), 1)


def llama_predictions(llama: "LlamaSession", engine: PromptCacheEngine,
                      prompts: Sequence[str], steps: int,
                      forced: Sequence[Sequence[int]]) -> list[list[int]]:
    """As :func:`predictions`, from llama.cpp reading the engine's token ids."""
    out = []
    for i, prompt in enumerate(prompts):
        ids = engine.prompt_ids(engine.prepare_messages([{"role": "user", "content": prompt}]))
        predicted = [int(llama.prefill(ids).argmax())]
        for step in range(steps):
            predicted.append(int(llama.step(forced[i][step], len(ids) + step).argmax()))
        out.append(predicted)
    return out


def open_llama_for(model: str, threads: int, work: Path) -> "LlamaSession | None":
    """llama.cpp on the packaged Q4_K_M GGUF (Gemma 3 270M only), or None with a note."""
    if model != "builtin:gemma-3-270m":
        return None
    try:
        from _llama_cpp_sync import open_llama
    except ImportError as exc:
        note(f"llama.cpp: {exc}")
        return None
    from meancache.upstream.gemma import assemble

    try:
        return open_llama(assemble(work), threads)
    except ImportError as exc:
        note(f"llama.cpp: {exc}")
        return None


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="default builtin:gemma-3-270m (--quick: tiny-gemma3)")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS,
                        default=[p for p in PRECISIONS if p != AUTO],
                        help="default: every one but auto (which is one of them)")
    parser.add_argument("--questions", type=int, help="timed questions per precision")
    parser.add_argument("--question-chars", type=int, default=120)
    parser.add_argument("--prompts", type=int, help="prompts for the agreement check")
    parser.add_argument("--steps", type=int, default=8,
                        help="decode steps per prompt in the agreement check")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = apply_defaults(parser.parse_args(),
                          {"model": "builtin:gemma-3-270m", "questions": 12, "prompts": 200},
                          {"model": "builtin:tiny-gemma3", "questions": 3, "prompts": 10})
    torch.set_num_threads(args.threads)
    load_before = machine_load()
    questions = instructions(args.data_dir / "instructions" / "arena_first_turns.jsonl",
                             args.questions, args.question_chars)
    prompts = instructions(args.data_dir / "instructions" / "sharegpt_first_turns.jsonl",
                           args.prompts, 2000)

    engines: dict[str, PromptCacheEngine] = {}
    loads: dict[str, float] = {}
    predicted: dict[str, list[list[int]]] = {}
    order = sorted(args.precisions, key=lambda p: p != "float32")  # the reference first
    for precision in order:
        note(f"{args.model} in {precision} ...")
        start = time.perf_counter()
        engines[precision] = PromptCacheEngine(load_model(args.model, device="cpu",
                                                          data_dir=args.cache_dir,
                                                          precision=precision))
        loads[precision] = time.perf_counter() - start
        predicted[precision] = predictions(engines[precision], prompts, args.steps,
                                           predicted.get("float32"))
    engine = engines[order[-1]]  # for the token ids llama.cpp reads (the same tokenizer)
    runners: dict[str, Callable[[str], Answer]] = {
        f"meancache {p}": partial(engine_answer, e, max_tokens=args.max_tokens)
        for p, e in engines.items()}
    with tempfile.TemporaryDirectory(prefix="meancache-gguf-") as work:
        start = time.perf_counter()
        llama = open_llama_for(args.model, args.threads, Path(work))
        if llama is not None:
            loads[LLAMA] = time.perf_counter() - start
            runners[LLAMA] = partial(llama_answer, llama, engine, max_tokens=args.max_tokens)
            if "float32" in predicted:
                predicted[LLAMA] = llama_predictions(llama, engine, prompts, args.steps,
                                                     predicted["float32"])
        note(f"timing {', '.join(runners)}, question by question ...")
        speeds = interleaved(runners, questions)

    heading(f"Generation speed, {args.model}, {args.threads} threads, "
            f"{len(questions)} questions interleaved, greedy, up to {args.max_tokens} tokens")
    table = make_table(["runtime", "load s", "TTFT ms (p50)", "decode tokens/s (p50)",
                        "tokens per answer", f"top-1 = float32: first token ({len(prompts)})",
                        f"decode steps ({len(prompts)} x {args.steps})"])
    reference = predicted.get("float32")
    for name, speed in speeds.items():
        key = name.removeprefix("meancache ")
        first, steps = agreement(predicted[key], reference) if reference else (0, 0)
        table.add_row(name, f"{loads[key]:.1f}", f"{speed.ttft_ms:.0f}",
                      f"{speed.tokens_per_s:.1f}", str(speed.tokens),
                      f"{first:.1%}" if reference else "-",
                      f"{steps:.1%}" if reference else "-")
    print_table(table)
    note(f"machine: {load_before} at the start; {machine_load()} at the end")
    print_command()


if __name__ == "__main__":
    main()
