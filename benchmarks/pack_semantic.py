"""The semantic match of pack instructions (the device's PackStore.lookup_similar with the
real MiniLM encoder): how often it answers, and how often rightly.

1. Precision on labelled pairs: a pack of QQP dev q1 questions, asked each pair's q2
   (differently worded). A served match is right when (q2, matched) is a labelled
   duplicate, wrong when it is a labelled non-duplicate, unjudged when it matched another
   pack question (QQP labels only its own pairs).
2. Hit rate on held-out instructions: a pack of the Arena train split (real instructions
   standing in for predicted ones; the seeded 80/10/10 split of instruction_packs.py),
   asked the test split: exact hits, then semantic hits beyond them; embedding time and
   lookup latency. A sample of semantic matches is printed to judge by eye.

Run from the repository root:

    python benchmarks/pack_semantic.py
    python benchmarks/pack_semantic.py --quick
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from _common import (
    Stopwatch,
    apply_defaults,
    base_parser,
    fmt,
    heading,
    load_encoder,
    load_qqp,
    machine_load,
    make_table,
    note,
    pct,
    print_command,
    print_table,
    sample,
    time_each,
)
from meancache.client.pack import PackStore
from meancache.client.pack.store import PACK_FILE
from meancache.shared.encoder import Encoder
from meancache.shared.pack import normalise_instruction, write_pack
from meancache.shared.threshold import DEFAULT_THRESHOLD
from meancache.upstream.pack.data import read_instructions, split_instructions

FULL = {"pairs": 2000, "instructions": 4000, "taus": [0.8, DEFAULT_THRESHOLD, 0.9]}
QUICK = {"pairs": 200, "instructions": 400, "taus": [DEFAULT_THRESHOLD]}
ANSWER = "x" * 200
SAMPLES = 12


def ready_store(directory: Path, instructions: list[str], encoder: Encoder) -> tuple[
        PackStore, float]:
    """A pack of ``instructions``, embedded; and the seconds the embedding took."""
    write_pack(directory / PACK_FILE, ((t, ANSWER) for t in instructions), "bench", 0.0)
    packs = PackStore(directory)
    watch = Stopwatch()
    packs.prepare(encoder)
    packs.embeddings.wait()
    if packs.embeddings.background.last_error:
        raise SystemExit(packs.embeddings.background.last_error)
    return packs, watch.seconds


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--pairs", type=int, help="QQP dev pairs in the labelled pack")
    parser.add_argument("--instructions", type=int, help="Arena instructions to split")
    parser.add_argument("--taus", type=float, nargs="+", help="thresholds to measure at")
    parser.add_argument("--backend", default="onnx", help="the encoder's backend")
    args = apply_defaults(parser.parse_args(), FULL, QUICK)
    print_command()
    note(machine_load())
    encoder = load_encoder(args.backend, args.cache_dir)

    pairs = [p for p in sample(load_qqp(args.data_dir, "dev"), args.pairs, args.seed)
             if normalise_instruction(p.q1) != normalise_instruction(p.q2)]
    labels = {(normalise_instruction(p.q2), normalise_instruction(p.q1)): p.label
              for p in pairs}
    with tempfile.TemporaryDirectory() as tmp:
        packs, _ = ready_store(Path(tmp), [p.q1 for p in pairs], encoder)
        heading(f"1. semantic pack hits on {len(pairs)} QQP dev pairs (pack: the q1s, "
                f"{packs.stats().entries} distinct; queries: the q2s; "
                f"{sum(p.label for p in pairs)} duplicates)")
        table = make_table(["tau", "served", "right", "wrong", "unjudged", "precision",
                            "duplicates served", "non-duplicates served"])
        for tau in args.taus:
            right = wrong = unjudged = served_dup = served_non = 0
            for pair in pairs:
                found = packs.lookup_similar(pair.q2, encoder, tau)
                if found is None:
                    continue
                label = labels.get((normalise_instruction(pair.q2), found.instruction))
                right += label == 1
                wrong += label == 0
                unjudged += label is None
                own = found.instruction == normalise_instruction(pair.q1)
                served_dup += own and pair.label == 1
                served_non += own and pair.label == 0
            duplicates = sum(p.label for p in pairs)
            table.add_row(fmt(tau), str(right + wrong + unjudged), str(right), str(wrong),
                          str(unjudged), pct(right / max(right + wrong, 1)),
                          pct(served_dup / max(duplicates, 1)),
                          pct(served_non / max(len(pairs) - duplicates, 1)))
        print_table(table)

    source = args.data_dir / "instructions" / "arena_first_turns.jsonl"
    texts = read_instructions(source)[:args.instructions]
    split = split_instructions(texts, args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        packs, seconds = ready_store(Path(tmp), split.train, encoder)
        entries = packs.stats().entries
        heading(f"2. held-out Arena instructions: pack of {entries} train instructions "
                f"(embedded in {seconds:.1f} s, {entries / seconds:.0f}/s), "
                f"{len(split.test)} test queries")
        table = make_table(["tau", "exact hits", "semantic hits (beyond exact)",
                            "lookup_similar p50 ms", "p99 ms"])
        shown: list[tuple[str, str, float]] = []
        for tau in args.taus:
            exact = sum(packs.lookup(t) is not None for t in split.test)
            misses = [t for t in split.test if packs.lookup(t) is None]
            found = {t: packs.lookup_similar(t, encoder, tau) for t in misses}
            semantic = [(t, f.instruction, f.similarity) for t, f in found.items()
                        if f is not None]
            latency = time_each(lambda t, tau=tau: packs.lookup_similar(t, encoder, tau),
                                misses[:200])
            table.add_row(fmt(tau), pct(exact / len(split.test)),
                          pct(len(semantic) / len(split.test)), fmt(latency.p50, 2),
                          fmt(latency.p99, 2))
            if tau == DEFAULT_THRESHOLD:
                shown = semantic[:SAMPLES]
        print_table(table)
    if shown:
        heading(f"2b. semantic matches at tau {DEFAULT_THRESHOLD} (the first {len(shown)}), "
                "to judge by eye")
        table = make_table(["query", "matched pack instruction", "cosine"], right_from=2)
        for query, instruction, similarity in shown:
            table.add_row(query[:70], instruction[:70], fmt(similarity))
        print_table(table)
    note(machine_load())


if __name__ == "__main__":
    main()
