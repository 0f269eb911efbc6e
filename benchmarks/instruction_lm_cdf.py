"""The instruction LMs' NLL CDFs on the validation split (issue 10, section 1): Gemma 3 270M
untuned, Gemma 3 270M fine-tuned on instructions, and the small GPT-2 trained from scratch.
The share of validation instructions with NLL <= x is InstCache's predicted hit rate for
a budget sigma = x, so one table at the same x's compares the three.

NLL is of the whole instruction and its end token (nats), so models with different
tokenizers compare; an instruction longer than --max-depth tokens (with its end token)
is out of the search's reach and counts as infinite. Each model's NLLs are cached under
--cache-dir, keyed by the model's files and the texts.

Train the two LMs first (see benchmarks/README.md), then:

    python benchmarks/instruction_lm_cdf.py --tuned DIR --scratch DIR
    python benchmarks/instruction_lm_cdf.py --tuned DIR --scratch DIR --plot docs/nll_cdf.png
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
from _common import (
    Stopwatch,
    base_parser,
    heading,
    machine_load,
    make_table,
    note,
    pct,
    print_command,
    print_table,
)
from _plot import add_plot_option, line_chart
from meancache.upstream.model_loading import GEMMA, load_model
from meancache.upstream.pack.data import read_instructions, split_instructions
from meancache.upstream.pack.lm import META_FILE, InstructionLM, load_lm, wrap
from meancache.upstream.pack.nll import instruction_nll
from meancache.upstream.pack.plan import predicted_hit_rate

XS = (10.0, 15.0, 20.0, 30.0, 40.0, 60.0, 80.0, 100.0)


def cached_nll(name: str, identity: str, load: Callable[[], InstructionLM], texts: list[str],
               max_depth: int, cache_dir: Path) -> list[float]:
    key = hashlib.sha256(json.dumps([identity, texts, max_depth]).encode()).hexdigest()[:16]
    path = cache_dir / "instruction-nll" / f"{key}.json"
    if path.is_file():
        return [float(x) for x in json.loads(path.read_text(encoding="utf-8"))]
    note(f"{name}: NLL of {len(texts)} validation instructions")
    watch = Stopwatch()
    nlls = instruction_nll(load(), texts, max_depth, batch_size=16)
    note(f"{name}: {watch.seconds:.0f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps([str(x) for x in nlls]), encoding="utf-8")
    return nlls


def identity(directory: Path) -> str:
    """A trained LM's identity: its path and its weights' size and time."""
    weights = directory / "model.safetensors"
    stat = weights.stat()
    return f"{directory.resolve()}:{stat.st_size}:{stat.st_mtime_ns}"


def described(directory: Path) -> str:
    meta = json.loads((directory / META_FILE).read_text(encoding="utf-8"))
    config = meta["config"]
    seconds = f", {meta['seconds']:.0f} s" if "seconds" in meta else ""
    return (f"{meta['train']} train instructions, {meta['steps']} steps of "
            f"{config['batch_size']}, lr {config['learning_rate']}, max {config['max_tokens']} "
            f"tokens{', embedding frozen' if config.get('freeze_embeddings') else ''}{seconds}")


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--tuned", type=Path, required=True, help="`pack train-lm --base "
                        f"{GEMMA}` output")
    parser.add_argument("--scratch", type=Path, required=True, help="`pack train-lm` output "
                        "(from scratch)")
    parser.add_argument("--max-depth", type=int, default=24)
    parser.add_argument("--threads", type=int, default=2)
    add_plot_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    print_command()
    note(machine_load())
    source = args.data_dir / "instructions" / "arena_first_turns.jsonl"
    validation = split_instructions(read_instructions(source), args.seed).validation

    def untuned() -> InstructionLM:
        loaded = load_model(GEMMA, device="cpu", data_dir=args.cache_dir)
        return wrap(loaded.model, loaded.tokenizer)

    models = {
        "Gemma 3 270M, untuned": cached_nll("untuned Gemma", GEMMA, untuned, validation,
                                            args.max_depth, args.cache_dir),
        "Gemma 3 270M, fine-tuned": cached_nll(
            "fine-tuned Gemma", identity(args.tuned), lambda: load_lm(args.tuned), validation,
            args.max_depth, args.cache_dir),
        "GPT-2 from scratch": cached_nll(
            "from-scratch GPT-2", identity(args.scratch), lambda: load_lm(args.scratch),
            validation, args.max_depth, args.cache_dir),
    }
    heading(f"NLL CDF on {len(validation)} validation instructions (Arena, seed {args.seed}"
            f"; share with NLL <= x nats; max depth {args.max_depth} tokens)")
    table = make_table(["model", *(f"<= {x:g}" for x in XS), "median NLL", "reachable"])
    for name, nlls in models.items():
        finite = sorted(n for n in nlls if math.isfinite(n))
        median = sorted(nlls)[len(nlls) // 2]
        table.add_row(name, *(pct(predicted_hit_rate(nlls, x)) for x in XS),
                      f"{median:.1f}", pct(len(finite) / len(nlls)))
    print_table(table)
    if args.plot:
        grid = [XS[-1] * i / 100 for i in range(101)]
        line_chart(args.plot, "Instruction LMs: NLL CDF (InstCache's predicted hit rate)",
                   "NLL budget sigma (nats)", "validation instructions with NLL <= sigma (%)",
                   {name: (grid, [100 * predicted_hit_rate(nlls, x) for x in grid])
                    for name, nlls in models.items()},
                   subtitle=f"{len(validation)} Arena validation instructions, seed "
                            f"{args.seed}; max depth {args.max_depth} tokens",
                   y_limits=(0, 100))
    note(f"fine-tuned: {described(args.tuned)}")
    note(f"from scratch: {described(args.scratch)}")
    note(machine_load())


if __name__ == "__main__":
    main()
