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
3. With --lm, a pack the tree search predicts (Algorithm 1 with that instruction LM at
   --sigma; the instructions are cached under --cache-dir), asked the same test split:
   exact and semantic hits, the semantic ones judged against a small hand-labelled set
   (benchmarks/pack_predicted_labels.jsonl: does the matched instruction ask the same
   thing as the query?); every semantic match is printed with its label.

Run from the repository root:

    python benchmarks/pack_semantic.py
    python benchmarks/pack_semantic.py --quick
    python benchmarks/pack_semantic.py --lm ~/.cache/meancache-bench/instruction-lm/KEY
"""

from __future__ import annotations

import argparse
import hashlib
import json
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
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.store import EntryStore
from meancache.client.cache.threshold import ThresholdState
from meancache.client.matching.matcher import Matcher
from meancache.client.pack import PackHit, PackStore
from meancache.client.pack.store import PACK_FILE
from meancache.shared.encoder import Encoder
from meancache.shared.jsonl import jsonl_lines
from meancache.shared.pack import write_pack
from meancache.shared.query import normalise_query
from meancache.shared.threshold import DEFAULT_THRESHOLD
from meancache.upstream.pack.data import read_instructions, split_instructions
from meancache.upstream.pack.lm import load_lm
from meancache.upstream.pack.search import SearchConfig, tree_search

FULL = {"pairs": 2000, "instructions": 4000, "taus": [0.8, DEFAULT_THRESHOLD, 0.9]}
QUICK = {"pairs": 200, "instructions": 400, "taus": [DEFAULT_THRESHOLD]}
ANSWER = "x" * 200
SAMPLES = 12
LABELS = Path(__file__).with_name("pack_predicted_labels.jsonl")


def predicted_pack(lm_dir: Path, config: SearchConfig, cache_dir: Path) -> list[str]:
    """The instructions the search finds with this LM and config (cached)."""
    weights = (lm_dir / "model.safetensors").stat()
    key = hashlib.sha256(repr((str(lm_dir.resolve()), weights.st_size, weights.st_mtime_ns,
                               config)).encode()).hexdigest()[:16]
    path = cache_dir / "predicted-packs" / f"{key}.json"
    if path.is_file():
        return json.loads(path.read_text(encoding="utf-8"))
    note(f"searching at sigma {config.sigma:g} with {lm_dir}")
    found = sorted(tree_search(load_lm(lm_dir), config).instructions)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(found), encoding="utf-8")
    return found


def read_labels(path: Path) -> dict[tuple[str, str], bool]:
    """(query, matched instruction) -> whether they ask the same thing (labelled by hand)."""
    labels: dict[tuple[str, str], bool] = {}
    for _, line in jsonl_lines(path.read_text(encoding="utf-8")):
        row = json.loads(line)
        labels[(row["query"], row["matched"])] = bool(row["same"])
    return labels


def matcher_at(directory: Path, encoder: Encoder, tau: float) -> Matcher:
    """The device's decision at a fixed tau (its feedback store a scratch one)."""
    store = EntryStore(directory / f"matcher-{tau}")
    return Matcher(encoder, ThresholdState(store, tau), store, CacheSettings().matching)


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
    parser.add_argument("--sections", type=int, nargs="+", default=[1, 2, 3],
                        help="which sections to run (3 needs --lm)")
    parser.add_argument("--lm", type=Path, help="an instruction LM (`pack train-lm` output): "
                        "also measure a pack it predicts (section 3)")
    parser.add_argument("--sigma", type=float, default=15.0, help="the predicted pack's budget")
    parser.add_argument("--children", type=int, nargs=2, default=[200, 20],
                        help="per node: up to depth 10, deeper")
    parser.add_argument("--max-depth", type=int, default=24)
    args = apply_defaults(parser.parse_args(), FULL, QUICK)
    print_command()
    note(machine_load())
    encoder = load_encoder(args.backend, args.cache_dir)

    if 1 in args.sections:
        labelled_pairs_section(args, encoder)
    source = args.data_dir / "instructions" / "arena_first_turns.jsonl"
    texts = read_instructions(source)[:args.instructions]
    split = split_instructions(texts, args.seed)
    if 2 in args.sections:
        held_out_section(args, split.train, split.test, encoder)
    if 3 in args.sections and args.lm is not None:
        predicted_section(args, split.test, encoder)
    note(machine_load())


def labelled_pairs_section(args: argparse.Namespace, encoder: Encoder) -> None:
    pairs = [p for p in sample(load_qqp(args.data_dir, "dev"), args.pairs, args.seed)
             if normalise_query(p.q1) != normalise_query(p.q2)]
    labels = {(normalise_query(p.q2), normalise_query(p.q1)): p.label
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
            matcher = matcher_at(Path(tmp), encoder, tau)
            for pair in pairs:
                found = packs.lookup_similar(pair.q2, matcher)
                if not isinstance(found, PackHit):
                    continue
                label = labels.get((normalise_query(pair.q2), found.instruction))
                right += label == 1
                wrong += label == 0
                unjudged += label is None
                own = found.instruction == normalise_query(pair.q1)
                served_dup += own and pair.label == 1
                served_non += own and pair.label == 0
            duplicates = sum(p.label for p in pairs)
            table.add_row(fmt(tau), str(right + wrong + unjudged), str(right), str(wrong),
                          str(unjudged), pct(right / max(right + wrong, 1)),
                          pct(served_dup / max(duplicates, 1)),
                          pct(served_non / max(len(pairs) - duplicates, 1)))
        print_table(table)


def held_out_section(args: argparse.Namespace, train: list[str], test: list[str],
                     encoder: Encoder) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        packs, seconds = ready_store(Path(tmp), train, encoder)
        entries = packs.stats().entries
        heading(f"2. held-out Arena instructions: pack of {entries} train instructions "
                f"(embedded in {seconds:.1f} s, {entries / seconds:.0f}/s), "
                f"{len(test)} test queries")
        table = make_table(["tau", "exact hits", "semantic hits (beyond exact)",
                            "lookup_similar p50 ms", "p99 ms"])
        shown: list[tuple[str, str, float]] = []
        for tau in args.taus:
            exact = sum(packs.lookup(t) is not None for t in test)
            misses = [t for t in test if packs.lookup(t) is None]
            matcher = matcher_at(Path(tmp), encoder, tau)
            found = {t: packs.lookup_similar(t, matcher) for t in misses}
            semantic = [(t, f.instruction, f.similarity) for t, f in found.items()
                        if isinstance(f, PackHit)]
            latency = time_each(lambda t, m=matcher: packs.lookup_similar(t, m), misses[:200])
            table.add_row(fmt(tau), pct(exact / len(test)),
                          pct(len(semantic) / len(test)), fmt(latency.p50, 2),
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


def predicted_section(args: argparse.Namespace, test: list[str], encoder: Encoder) -> None:
    shallow, deep = args.children
    config = SearchConfig(args.sigma, args.max_depth, ((10, shallow), (10**9, deep)), 64)
    instructions = predicted_pack(args.lm, config, args.cache_dir)
    labels = read_labels(LABELS)
    with tempfile.TemporaryDirectory() as tmp:
        packs, _ = ready_store(Path(tmp), instructions, encoder)
        heading(f"3. a predicted pack: {len(instructions)} instructions the search finds at "
                f"sigma {args.sigma:g} (children {shallow} / {deep}, max depth "
                f"{args.max_depth}), asked {len(test)} held-out Arena test instructions; "
                f"semantic hits judged by {LABELS.name}")
        table = make_table(["tau", "exact hits", "semantic hits (beyond exact)", "same",
                            "different", "unjudged", "precision"])
        matches: dict[tuple[str, str], float] = {}
        for tau in args.taus:
            misses = [t for t in test if packs.lookup(t) is None]
            matcher = matcher_at(Path(tmp), encoder, tau)
            found = [(t, f.instruction, f.similarity) for t in misses
                     if isinstance(f := packs.lookup_similar(t, matcher), PackHit)]
            judged = [labels.get((t, m)) for t, m, _ in found]
            same, different = judged.count(True), judged.count(False)
            table.add_row(fmt(tau), pct((len(test) - len(misses)) / len(test)),
                          f"{pct(len(found) / len(test))} ({len(found)})", str(same),
                          str(different), str(judged.count(None)),
                          pct(same / max(same + different, 1)))
            matches.update({(t, m): c for t, m, c in found})
    print_table(table)
    heading(f"3b. every semantic match of the predicted pack at tau >= {min(args.taus)}")
    table = make_table(["query", "matched pack instruction", "cosine", "same thing?"],
                       right_from=2)
    for (query, matched), similarity in sorted(matches.items(), key=lambda m: -m[1]):
        label = labels.get((query, matched))
        table.add_row(query[:80], matched[:80], fmt(similarity),
                      "unlabelled" if label is None else "yes" if label else "no")
    print_table(table)


if __name__ == "__main__":
    main()
