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
its decode steps are what int8 changes.

llama.cpp: when llama-cpp-python is importable (install it into this venv, or run in the
venv scripts/llama_cpp_integration.sh makes), the same questions on the packaged Q4_K_M
GGUF with the same thread count, loaded as scripts/llama_cpp_server.py loads it (without
the AMX repack that crashes here).

    python benchmarks/generation_speed.py                  # Gemma 3 270M, float32 and int8
    python benchmarks/generation_speed.py --quick          # builtin:tiny-gemma3, a few prompts
"""

import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from _common import (
    REPO_ROOT,
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
from meancache.upstream.precision import PRECISIONS
from meancache.upstream.prompt_cache.engine import Delta, Finish, PromptCacheEngine
from meancache.upstream.sampling import SamplingParams


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


def engine_speed(engine: PromptCacheEngine, questions: Sequence[str], max_tokens: int) -> Speed:
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    ttfts, rates, counts = [], [], []
    for i, question in enumerate([questions[0], *questions]):  # the first is a warm-up
        prepared = engine.prepare_messages([{"role": "user", "content": question}])
        start = time.perf_counter()
        first = None
        finish = None
        for event in engine.generate(prepared, params):
            if isinstance(event, Delta) and first is None:
                first = time.perf_counter()
            if isinstance(event, Finish):
                finish = event
        end = time.perf_counter()
        if i == 0 or finish is None or finish.completion_tokens < 2 or first is None:
            continue
        ttfts.append(finish.ttft_seconds * 1000)
        rates.append((finish.completion_tokens - 1) / (end - start - finish.ttft_seconds))
        counts.append(finish.completion_tokens)
    return Speed(statistics.median(ttfts), statistics.median(rates),
                 int(statistics.median(counts)))


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


def llama_cpp_speed(questions: Sequence[str], max_tokens: int, threads: int,
                    template: PromptCacheEngine) -> Speed | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    sys.path.insert(0, str(REPO_ROOT / "scripts"))
    from llama_cpp_server import disable_extra_buffers

    disable_extra_buffers()
    from meancache.upstream.gemma import assemble

    with tempfile.TemporaryDirectory(prefix="meancache-gguf-") as work:
        llm = Llama(model_path=str(assemble(Path(work))), n_threads=threads, n_ctx=2048,
                    verbose=False)
        ttfts, rates, counts = [], [], []
        for i, question in enumerate([questions[0], *questions]):
            text = template.tokenizer.apply_chat_template(
                [{"role": "user", "content": question}], tokenize=False,
                add_generation_prompt=True)
            start = time.perf_counter()
            first, n = None, 0
            for _ in llm(text, max_tokens=max_tokens, temperature=0.0, stream=True,
                         stop=list(template.loaded.stop) or None):
                first = first or time.perf_counter()
                n += 1
            end = time.perf_counter()
            if i == 0 or first is None or n < 2:
                continue
            ttfts.append((first - start) * 1000)
            rates.append((n - 1) / (end - first))
            counts.append(n)
    return Speed(statistics.median(ttfts), statistics.median(rates),
                 int(statistics.median(counts)))


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="default builtin:gemma-3-270m (--quick: tiny-gemma3)")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
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

    speeds: dict[str, Speed] = {}
    loads: dict[str, float] = {}
    predicted: dict[str, list[list[int]]] = {}
    engine = None
    order = sorted(args.precisions, key=lambda p: p != "float32")  # the reference first
    for precision in order:
        note(f"{args.model} in {precision} ...")
        start = time.perf_counter()
        engine = PromptCacheEngine(load_model(args.model, device="cpu",
                                              data_dir=args.cache_dir, precision=precision))
        loads[precision] = time.perf_counter() - start
        speeds[precision] = engine_speed(engine, questions, args.max_tokens)
        predicted[precision] = predictions(engine, prompts, args.steps,
                                           predicted.get("float32"))
    llama = llama_cpp_speed(questions, args.max_tokens, args.threads, engine) \
        if engine is not None and args.model == "builtin:gemma-3-270m" else None

    heading(f"Generation speed, {args.model}, {args.threads} threads, "
            f"{len(questions)} questions, greedy, up to {args.max_tokens} tokens")
    table = make_table(["runtime", "load s", "TTFT ms (p50)", "decode tokens/s (p50)",
                        "tokens per answer", f"top-1 = float32: first token ({len(prompts)})",
                        f"decode steps ({len(prompts)} x {args.steps})"])
    reference = predicted.get("float32")
    for precision, speed in speeds.items():
        first, steps = agreement(predicted[precision], reference) if reference else (0, 0)
        table.add_row(f"meancache {precision}", f"{loads[precision]:.1f}",
                      f"{speed.ttft_ms:.0f}", f"{speed.tokens_per_s:.1f}", str(speed.tokens),
                      f"{first:.1%}" if reference else "-",
                      f"{steps:.1%}" if reference else "-")
    if llama is not None:
        table.add_row("llama.cpp Q4_K_M", "-", f"{llama.ttft_ms:.0f}",
                      f"{llama.tokens_per_s:.1f}", str(llama.tokens), "-", "-")
    else:
        note("llama.cpp: llama-cpp-python is not installed here "
             "(scripts/llama_cpp_integration.sh builds it)")
    print_table(table)
    note(f"machine: {load_before} at the start; {machine_load()} at the end")
    print_command()


if __name__ == "__main__":
    main()
