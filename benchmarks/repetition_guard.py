"""Degenerate loops of the embedded model with and without the repetition guard.

Answers held-out Arena first turns (the test part of a seeded 80/10/10 split of
instructions/arena_first_turns.jsonl) greedily through the Prompt Cache engine, as the
server answers them, once with the guard off (no penalty, no loop stop) and once with the
server's defaults (upstream.sampling_params.SERVER_DEFAULTS). The defaults were chosen with
``--split validation`` and the ``--dry-multiplier``/``--repetition-penalty`` overrides, on
the validation part only; the test part is for the report.

A loop is counted by a rule that is not the guard's own: some run of 6 words (lower-cased,
punctuation dropped) occurs 3 or more times in the answer. The table also counts answers
cut at the token cap, answers the loop stop ended, the median answer length and decode
tokens per second (all tokens over all time).

    python benchmarks/repetition_guard.py            # Gemma 3 270M, 100 questions, 512 tokens
    python benchmarks/repetition_guard.py --split validation --dry-multiplier 0  # tuning
    python benchmarks/repetition_guard.py --quick    # builtin:tiny-gemma3, 5 questions
"""

import re
import statistics
import time
from collections import Counter
from dataclasses import dataclass, replace

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
from meancache.upstream.pack.data import read_instructions, split_instructions
from meancache.upstream.prompt_cache.engine import Delta, Finish, PromptCacheEngine
from meancache.upstream.sampling_params import SERVER_DEFAULTS, SamplingParams

PHRASE_WORDS = 6
PHRASE_REPEATS = 3


def most_repeated(text: str) -> tuple[str, int]:
    """The PHRASE_WORDS-word run said most often in ``text``, and how often."""
    words = re.findall(r"[a-z0-9']+", text.lower())
    runs = Counter(tuple(words[i:i + PHRASE_WORDS]) for i in range(len(words) - 5))
    if not runs:
        return "", 0
    phrase, count = runs.most_common(1)[0]
    return " ".join(phrase), count


def loops(text: str) -> bool:
    """Whether some PHRASE_WORDS-word run occurs PHRASE_REPEATS times or more."""
    return most_repeated(text)[1] >= PHRASE_REPEATS


@dataclass
class Outcome:
    loops: int = 0
    at_cap: int = 0
    loop_stops: int = 0
    tokens: list[int] | None = None
    seconds: float = 0.0


def run(engine: PromptCacheEngine, questions: list[str], params: SamplingParams,
        label: str) -> tuple[Outcome, list[str]]:
    outcome, answers = Outcome(tokens=[]), []
    for i, question in enumerate(questions):
        start = time.perf_counter()
        prepared = engine.prepare_messages([{"role": "user", "content": question}])
        events = list(engine.generate(prepared, params))
        outcome.seconds += time.perf_counter() - start
        finish = events[-1]
        assert isinstance(finish, Finish)
        text = "".join(e.text for e in events if isinstance(e, Delta))
        answers.append(text)
        outcome.loops += loops(text)
        outcome.at_cap += finish.reason == "length"
        outcome.loop_stops += finish.reason == "loop"
        assert outcome.tokens is not None
        outcome.tokens.append(finish.completion_tokens)
        note(f"{label} {i + 1}/{len(questions)}: {finish.reason}, "
             f"{finish.completion_tokens} tokens, loops so far {outcome.loops}")
    return outcome, answers


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", help="default builtin:gemma-3-270m (--quick: tiny-gemma3)")
    parser.add_argument("--questions", type=int, help="held-out questions")
    parser.add_argument("--max-tokens", type=int,
                        help="default 512, the chat's answer length (--quick: 48)")
    parser.add_argument("--precision", default="fp16-int8",
                        help="fp16-int8 picks float32's next token (generation_speed.py) "
                        "at 1.6x its speed")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--split", choices=("test", "validation"), default="test",
                        help="the part of the split asked (default: test; tune on validation)")
    parser.add_argument("--dry-multiplier", type=float, help="the guard's DRY multiplier "
                        f"(default {SERVER_DEFAULTS.dry_multiplier})")
    parser.add_argument("--repetition-penalty", type=float, help="the guard's repetition "
                        f"penalty (default {SERVER_DEFAULTS.repetition_penalty})")
    parser.add_argument("--show", type=int, default=0, help="print this many answer pairs")
    parser.add_argument("--off-questions", type=int, help="answer only the first N questions "
                        "with the guard off (default: all; the unguarded loops run to the "
                        "cap and cost most of the time)")
    args = apply_defaults(parser.parse_args(),
                          {"model": "builtin:gemma-3-270m", "questions": 100,
                           "max_tokens": 512},
                          {"model": "builtin:tiny-gemma3", "questions": 5, "max_tokens": 48})
    torch.set_num_threads(args.threads)
    load_before = machine_load()
    texts = read_instructions(args.data_dir / "instructions" / "arena_first_turns.jsonl")
    questions = getattr(split_instructions(texts, seed=args.seed), args.split)[:args.questions]
    engine = PromptCacheEngine(load_model(args.model, device="cpu", data_dir=args.cache_dir,
                                          precision=args.precision))
    greedy = replace(SERVER_DEFAULTS, max_tokens=args.max_tokens, temperature=0.0)
    if args.dry_multiplier is not None:
        greedy = replace(greedy, dry_multiplier=args.dry_multiplier)
    if args.repetition_penalty is not None:
        greedy = replace(greedy, repetition_penalty=args.repetition_penalty)
    off = questions[:args.off_questions]
    settings: dict[str, tuple[SamplingParams, list[str]]] = {
        f"on (penalty {greedy.repetition_penalty} over {greedy.repetition_window} tokens, "
        f"DRY {greedy.dry_multiplier} x {greedy.dry_base}^(run - "
        f"{greedy.dry_allowed_length}), loop stop), {len(questions)} questions": (
            greedy, questions),
        f"off, the first {len(off)} of them": (
            replace(greedy, repetition_penalty=1.0, dry_multiplier=0.0, stop_on_loops=False),
            off),
    }
    if not off:  # --off-questions 0: the guard alone (tuning)
        settings.popitem()
    results = {label: run(engine, asked, params, label)
               for label, (params, asked) in settings.items()}

    heading(f"Repetition guard, {args.model} ({args.precision}), {len(questions)} {args.split} "
            f"Arena first turns, greedy, up to {args.max_tokens} tokens, {args.threads} threads")
    table = make_table(["guard", "answers that loop", "cut at the cap", "ended by the loop stop",
                        "tokens per answer (median)", "decode tokens/s", "total s"])
    for label, (outcome, _) in results.items():
        assert outcome.tokens is not None
        table.add_row(label, f"{outcome.loops}", f"{outcome.at_cap}", f"{outcome.loop_stops}",
                      f"{statistics.median(outcome.tokens):.0f}",
                      f"{sum(outcome.tokens) / outcome.seconds:.1f}", f"{outcome.seconds:.0f}")
    print_table(table)
    answers = [texts for _, texts in results.values()]
    after, before = answers[0], answers[-1]
    for question, text in zip(questions, after, strict=True):
        if loops(text):
            phrase, count = most_repeated(text)
            print(f"guarded answer that loops: {question[:80]!r}: {phrase!r} x {count}")
    for question, old, new in list(zip(questions, before, after, strict=False))[:args.show]:
        print(f"\nQ: {question[:200]}\n  off: {old[:300]!r}\n  on:  {new[:300]!r}")
    note(f"machine: {load_before} at the start; {machine_load()} at the end")
    print_command()


if __name__ == "__main__":
    main()
