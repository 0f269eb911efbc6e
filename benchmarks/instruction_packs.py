"""Instruction packs (InstCache) on real instructions: pack size against the fitted
N = a(e^(b sigma) - 1), predicted hit rate (NLL CDF on the validation split) against the
measured exact hit rate on held-out instructions, build throughput, lookup latency and
bytes per entry.

The instruction LM is the small from-scratch GPT-2 (`meancache pack train-lm` without
--base), trained on the 80% train split of Chatbot Arena first turns (seeded 80/10/10);
it is kept under --cache-dir, keyed by its settings. Answers are not generated here (the
pack's answers come from the upstream model in `pack build`; a fixed 200-character answer
stands in for size and latency).

Tables: 1. NLL CDF on validation; 2. per sigma: pack size, fitted prediction, predicted
and measured exact hit rate, nodes expanded per second; 2b. the same search in process
and on local Ray workers; 3. lookup latency and bytes/entry.

Run from the repository root (the full run takes several minutes):

    python benchmarks/instruction_packs.py
    python benchmarks/instruction_packs.py --quick
    python benchmarks/instruction_packs.py --plot docs/pack_hit_rate.png   # and a chart
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from pathlib import Path

import numpy as np
import torch
from _common import (
    Stopwatch,
    apply_defaults,
    base_parser,
    fmt,
    heading,
    machine_load,
    make_table,
    note,
    pct,
    print_command,
    print_table,
    time_each,
)
from _plot import add_plot_option, line_chart
from meancache.shared.jsonl import jsonl_lines
from meancache.shared.pack import read_pack, write_pack
from meancache.upstream.pack.data import read_instructions, split_instructions
from meancache.upstream.pack.lm import TrainConfig, load_lm, train_lm
from meancache.upstream.pack.nll import instruction_nll
from meancache.upstream.pack.plan import SizeModel, predicted_hit_rate
from meancache.upstream.pack.search import SearchConfig, tree_search

FULL = {"instructions": 4000, "epochs": 4, "hidden": 128, "layers": 2,
        "fit_sigmas": [8.0, 10.0], "sigmas": [11.0, 12.0, 13.0], "children": [200, 20]}
QUICK = {"instructions": 400, "epochs": 4, "hidden": 64, "layers": 1,
         "fit_sigmas": [6.0, 8.0], "sigmas": [9.0, 10.0, 11.0], "children": [50, 10]}
ANSWER = "x" * 200


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--instructions", type=int, help="Arena instructions to use")
    parser.add_argument("--epochs", type=int)
    parser.add_argument("--hidden", type=int)
    parser.add_argument("--layers", type=int)
    parser.add_argument("--fit-sigmas", type=float, nargs=2)
    parser.add_argument("--sigmas", type=float, nargs="+")
    parser.add_argument("--children", type=int, nargs=2, help="per node: up to depth 10, deeper")
    parser.add_argument("--max-depth", type=int, default=24)
    parser.add_argument("--ray-workers", type=int, default=2, help="time the search at the "
                        "first --sigmas value with this many local Ray workers (0: skip)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (a shared "
                        "2-core machine: more threads only contend)")
    add_plot_option(parser)
    args = apply_defaults(parser.parse_args(), FULL, QUICK)
    torch.set_num_threads(args.threads)
    print_command()
    note(machine_load())

    source = args.data_dir / "instructions" / "arena_first_turns.jsonl"
    lines = [line for _, line in jsonl_lines(source.read_text(encoding="utf-8"))]
    lines = lines[:args.instructions]
    config = TrainConfig(epochs=args.epochs, hidden=args.hidden, layers=args.layers,
                         heads=4, seed=args.seed, max_tokens=args.max_depth)
    key = hashlib.sha256(json.dumps([lines, repr(config)]).encode()).hexdigest()[:12]
    lm_dir = args.cache_dir / "instruction-lm" / key
    data = args.cache_dir / "instruction-lm" / f"{key}.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("\n".join(lines) + "\n", encoding="utf-8")
    if not (lm_dir / "config.json").exists():
        note(f"training the instruction LM on {len(lines)} instructions ({config})")
        watch = Stopwatch()
        train_lm(data, lm_dir, config=config)
        seconds = watch.seconds
    else:
        seconds = None
    lm = load_lm(lm_dir)
    split = split_instructions(read_instructions(data), args.seed)
    validation = instruction_nll(lm, split.validation, args.max_depth)
    test = set(split.test)

    heading(f"1. NLL CDF on {len(validation)} validation instructions (from-scratch GPT-2, "
            f"{sum(p.numel() for p in lm.model.parameters()) / 1e6:.1f}M parameters"
            + (f", trained in {seconds:.0f} s" if seconds else "") + ")")
    table = make_table(["sigma (nats)", "share with NLL <= sigma"])
    finite = sorted(n for n in validation if math.isfinite(n))
    for q in (10, 20, 40, 60, 80):
        sigma = float(np.percentile(finite, q)) if finite else math.inf
        table.add_row(fmt(sigma, 1), pct(predicted_hit_rate(validation, sigma)))
    print_table(table)

    def search(sigma: float):  # noqa: ANN202
        shallow, deep = args.children
        note(f"searching at sigma {sigma:g}")
        return tree_search(lm, SearchConfig(sigma, args.max_depth,
                                            ((10, shallow), (10**9, deep)), 64))

    small, large = args.fit_sigmas
    fitted = [len(search(s).instructions) for s in (small, large)]
    model = SizeModel.fit(small, fitted[0], large, fitted[1])
    heading(f"2. pack size and hit rate per sigma (fit on N({small:g}) = {fitted[0]}, "
            f"N({large:g}) = {fitted[1]}: a = {model.a:.3g}, b = {model.b:.3g}; children "
            f"{args.children[0]} / {args.children[1]}, max depth {args.max_depth}; "
            f"{len(test)} held-out test instructions)")
    table = make_table(["sigma", "pack size", "fitted", "size error", "predicted hit",
                        "measured exact hit", "nodes expanded", "nodes/s (1 worker)"])
    biggest: dict[str, float] = {}
    measured: list[float] = []
    for sigma in args.sigmas:
        result = search(sigma)
        size, expected = len(result.instructions), model.size(sigma)
        hits = sum(t in result.instructions for t in split.test) / max(len(split.test), 1)
        measured.append(100 * hits)
        table.add_row(f"{sigma:g}", str(size), f"{expected:.0f}",
                      pct((size - expected) / expected), pct(predicted_hit_rate(
                          validation, sigma)), pct(hits), str(result.expanded),
                      f"{result.expanded / result.seconds:.0f}")
        biggest = result.instructions
    print_table(table)
    if args.plot:
        top = max(args.sigmas) * 1.5
        grid = [top * i / 100 for i in range(101)]
        line_chart(args.plot, "Instruction pack: predicted hit rate (NLL CDF) vs measured",
                   "NLL budget sigma (nats)", "hit rate (%)", {
                       f"predicted: share of {len(validation)} validation instructions with "
                       "NLL <= sigma": (grid, [100 * predicted_hit_rate(validation, x)
                                               for x in grid])},
                   points={f"measured: exact hits of {len(test)} held-out instructions in "
                           "the pack built at sigma": (args.sigmas, measured)},
                   subtitle=f"from-scratch GPT-2 instruction LM on {len(lines)} Arena first "
                            f"turns; children {args.children[0]} / {args.children[1]}, max "
                            f"depth {args.max_depth}")

    if args.ray_workers:
        from meancache.upstream.pack.parallel import parallel_search

        sigma = args.sigmas[0]
        shallow, deep = args.children
        config = SearchConfig(sigma, args.max_depth, ((10, shallow), (10**9, deep)), 64)
        note(f"searching at sigma {sigma:g} in-process and on {args.ray_workers} Ray workers")
        one = tree_search(lm, config)
        spread = parallel_search(lm_dir, config, args.ray_workers)
        heading(f"2b. build throughput at sigma {sigma:g} (Ray time includes starting Ray "
                "and loading the LM in each worker)")
        table = make_table(["search", "instructions", "nodes expanded", "seconds", "nodes/s"])
        for name, result in (("1 worker, in process", one),
                             (f"{args.ray_workers} Ray workers (local)", spread)):
            table.add_row(name, str(len(result.instructions)), str(result.expanded),
                          f"{result.seconds:.1f}", f"{result.expanded / result.seconds:.0f}")
        print_table(table)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "bench.mcpack"
        manifest = write_pack(path, ((t, ANSWER) for t in biggest), "bench", args.sigmas[-1])
        pack = read_pack(path)
        queries = [*split.test, *list(biggest)[:len(split.test)]]
        latency = time_each(pack.lookup, queries, warmup=queries[:20])
        size = path.stat().st_size
    heading(f"3. lookup (normalise + dict) on the sigma {args.sigmas[-1]:g} pack, "
            f"{manifest.count} entries, {len(queries)} queries (half hits)")
    table = make_table(["p50 ms", "p99 ms", "file bytes", "bytes / entry",
                        "bytes / entry without the 200-byte answer"], right_from=0)
    per_entry = size / max(manifest.count, 1)
    table.add_row(fmt(latency.p50, 4), fmt(latency.p99, 4), str(size), f"{per_entry:.0f}",
                  f"{per_entry - len(ANSWER):.0f}")
    print_table(table)
    note(machine_load())


if __name__ == "__main__":
    main()
