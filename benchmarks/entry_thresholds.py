"""Per-entry thresholds against one global tau, on a replayed stream with feedback.

The cache holds the q1 side of --pairs sampled QQP dev pairs; the stream asks every q2
side --repeats times in a seeded order. A served hit is right when the two questions are a
labelled duplicate; the simulated user rejects every wrong hit and accepts every right
one. Both modes run the real rules of client/matching/entry_threshold.py (accept, reject,
threshold) and, by default, the real verification step on each served candidate; the
lookup itself is the cache's (the best --candidates entries above the search floor, best
first, the first one that passes is served), computed on vectors embedded once.

``--stream hubs`` asks different questions of the same entry instead of repeats: the
cache holds every QQP question (all splits) that occurs in at least --hub-pairs pairs, and
the stream asks each of their partners once, so a rejection helps only if it keeps
*other* look-alikes of that entry away.

The global tau is swept; per-entry thresholds start from the same tau. Printed: hit rate,
precision and false hits per tau; false hits of each mode per quarter of the stream; and
false hits at matched hit rates (the global-tau curve interpolated at each per-entry
point's hit rate).

    python benchmarks/entry_thresholds.py            # MiniLM, 2,000 pairs x 4 repeats
    python benchmarks/entry_thresholds.py --stream hubs   # other look-alikes, no repeats
    python benchmarks/entry_thresholds.py --quick
    python benchmarks/entry_thresholds.py --plot docs/precision_hit_ratio.png   # and a chart
"""

from __future__ import annotations

import argparse
import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
from _common import (
    QQPPair,
    apply_defaults,
    base_parser,
    embed_cached,
    fmt,
    heading,
    load_encoder,
    load_qqp,
    make_table,
    note,
    pct,
    print_command,
    print_table,
    sample,
    unique,
)
from _plot import add_plot_option, line_chart
from meancache.client.cache.entry import STORED_DTYPE, Entry
from meancache.client.matching import entry_threshold
from meancache.client.matching.rules import verify

QUARTERS = 4


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__)
    parser.add_argument("--encoder", default="minilm", help="encoder profile or model directory")
    parser.add_argument("--stream", choices=["dev", "hubs"], default="dev",
                        help="dev: repeats of sampled dev pairs' q2; hubs: see above")
    parser.add_argument("--pairs", type=int, help="QQP dev pairs sampled (--stream dev)")
    parser.add_argument("--hub-pairs", type=int, default=3,
                        help="pairs a question needs to be cached (--stream hubs)")
    parser.add_argument("--repeats", type=int, default=4,
                        help="times each q2 is asked (--stream dev; hubs asks each once)")
    parser.add_argument("--candidates", type=int, default=8, help="entries checked per lookup")
    parser.add_argument("--taus", type=float, nargs="+",
                        default=[round(0.60 + 0.02 * i, 2) for i in range(16)],
                        help="global taus swept")
    parser.add_argument("--no-verify", action="store_true",
                        help="leave the verification step out of both modes")
    add_plot_option(parser)
    args = parser.parse_args()
    if args.stream == "hubs":
        args.repeats = 1
    return apply_defaults(args, {"pairs": 2000}, {"pairs": 300})


@dataclass
class Replay:
    """The outcome of one stream: hits and false hits, the latter per quarter."""

    queries: int = 0
    hits: int = 0
    false_hits: int = 0
    false_by_quarter: list[int] = field(default_factory=lambda: [0] * QUARTERS)

    @property
    def hit_rate(self) -> float:
        return self.hits / self.queries

    @property
    def precision(self) -> float | None:
        return None if self.hits == 0 else 1 - self.false_hits / self.hits


@dataclass(frozen=True)
class Stream:
    entries: list[str]  # cached questions
    queries: list[int]  # index into asked, in stream order
    asked: list[str]
    sims: np.ndarray  # (len(asked), len(entries)) cosine
    duplicates: frozenset[tuple[str, str]]  # (asked, cached) labelled duplicates


def hub_pairs(args: argparse.Namespace) -> list[QQPPair]:
    """Pairs turned so that q1 is a question of at least --hub-pairs pairs (the entry)."""
    pairs = load_qqp(args.data_dir)
    counts = Counter(q for p in pairs for q in (p.q1, p.q2))
    hubs = {q for q, n in counts.items() if n >= args.hub_pairs}
    turned = [p if p.q1 in hubs else QQPPair(p.q2, p.q1, p.label, p.split) for p in pairs
              if p.q1 in hubs or p.q2 in hubs]
    return [p for p in turned if p.q2 not in hubs]  # an asked question is never an entry


def build_stream(args: argparse.Namespace) -> Stream:
    if args.stream == "hubs":
        pairs = hub_pairs(args)
    else:
        pairs = sample(load_qqp(args.data_dir, "dev"), args.pairs, args.seed)
    entries = unique(p.q1 for p in pairs)
    asked = unique(p.q2 for p in pairs)
    duplicates = frozenset((p.q2, p.q1) for p in pairs if p.label == 1)
    encoder = load_encoder("onnx", args.cache_dir, model=args.encoder)
    vectors = embed_cached(encoder, unique(entries + asked), args.cache_dir)
    row = {text: i for i, text in enumerate(unique(entries + asked))}
    # Entries are stored as float16, as the cache stores them.
    stored = vectors[[row[t] for t in entries]].astype(STORED_DTYPE).astype(np.float32)
    sims = vectors[[row[t] for t in asked]] @ stored.T
    order = [i for i in range(len(asked)) for _ in range(args.repeats)]
    random.Random(args.seed).shuffle(order)
    note(f"{len(entries):,} cached questions, {len(order):,} queries "
         f"({sum(p.label for p in pairs):,} of {len(pairs):,} pairs are duplicates)")
    return Stream(entries, order, asked, sims, duplicates)


def replay(stream: Stream, tau: float, per_entry: bool, candidates: int, verifies: bool,
           vetoes: dict[tuple[str, str], bool]) -> Replay:
    """One pass of the stream with feedback; ``vetoes`` memoises the verification step."""
    empty = np.zeros(1, dtype=STORED_DTYPE)
    entries = [Entry(query=q, answer="-", embedding=empty, encoder_version="bench")
               for q in stream.entries]
    floor = entry_threshold.floor(tau) if per_entry else tau
    result = Replay(queries=len(stream.queries))
    for position, asked_row in enumerate(stream.queries):
        query, row = stream.asked[asked_row], stream.sims[asked_row]
        above = np.flatnonzero(row >= floor)
        above = above[np.argsort(-row[above], kind="stable")][:candidates]
        for e in above:
            entry, similarity = entries[e], float(row[e])
            if per_entry and similarity < entry_threshold.threshold(
                    entry_threshold.Evidence.of(entry), tau):
                continue
            if verifies:
                key = (query, entry.query)
                if key not in vetoes:
                    vetoes[key] = verify(query, entry.query) is not None
                if vetoes[key]:
                    continue
            result.hits += 1
            entry = entry_threshold.after_accept(entry, query)
            if (query, entry.query) not in stream.duplicates:
                result.false_hits += 1
                result.false_by_quarter[position * QUARTERS // len(stream.queries)] += 1
                entry = entry_threshold.after_reject(entry, query, similarity, "bench")
            entries[e] = entry
            break
    return result


def matched_false_hits(curve: list[Replay], hit_rate: float) -> float | None:
    """False hits of the global-tau curve interpolated at ``hit_rate`` (None outside it)."""
    points = sorted((r.hit_rate, r.false_hits) for r in curve)
    rates = [p[0] for p in points]
    if not rates[0] <= hit_rate <= rates[-1]:
        return None
    return float(np.interp(hit_rate, rates, [p[1] for p in points]))


def main() -> None:
    args = parse_args()
    print_command()
    stream = build_stream(args)
    vetoes: dict[tuple[str, str], bool] = {}
    runs = {mode: [replay(stream, tau, mode, args.candidates, not args.no_verify, vetoes)
                   for tau in args.taus] for mode in (False, True)}
    note("replayed every tau in both modes")

    setup = (f"{args.encoder}, stream {args.stream}: {len(stream.queries):,} queries on "
             f"{len(stream.entries):,} entries; verification "
             f"{'off' if args.no_verify else 'on'}")
    heading(setup)
    table = make_table(["tau", "global hit rate", "global precision", "global false hits",
                        "per-entry hit rate", "per-entry precision", "per-entry false hits",
                        "global false hits at per-entry hit rate", "false hits avoided"])
    for tau, one, own in zip(args.taus, runs[False], runs[True], strict=True):
        matched = matched_false_hits(runs[False], own.hit_rate)
        table.add_row(fmt(tau, 2), pct(one.hit_rate), fmt(one.precision), str(one.false_hits),
                      pct(own.hit_rate), fmt(own.precision), str(own.false_hits),
                      fmt(matched, 1),
                      "-" if matched is None else pct(1 - own.false_hits / matched))
    print_table(table)

    heading("false hits per quarter of the stream (feedback accumulates left to right)")
    table = make_table(["tau", "mode"] + [f"Q{q + 1}" for q in range(QUARTERS)], right_from=2)
    for tau, one, own in zip(args.taus, runs[False], runs[True], strict=True):
        for name, run in (("global", one), ("per-entry", own)):
            table.add_row(fmt(tau, 2), name, *map(str, run.false_by_quarter))
    print_table(table)
    if args.plot:
        line_chart(args.plot, "Precision against hit ratio: one global tau vs per-entry "
                   "thresholds", "hit ratio (share of queries served from the cache)",
                   "precision (share of served hits that are right)", {
                       name: ([r.hit_rate for r in runs[mode] if r.hits],
                              [r.precision for r in runs[mode] if r.hits])
                       for name, mode in (("one global tau", False),
                                          ("per-entry thresholds", True))},
                   subtitle=f"QQP dev, {setup}; one point per tau, {args.taus[0]:g} (right) "
                            f"to {args.taus[-1]:g} (left)")


if __name__ == "__main__":
    main()
