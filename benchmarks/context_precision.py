"""Context precision: does a follow-up query get answered from an entry that was asked in a
different conversational context? With context_aware=True vs False.

Every conversation of contextual/contextual_queries.json and contextual/d1.json is stored
in a fresh SemanticCache: the main query as turn 0 with no context, the follow-up as turn 1
with Context(prev_query=main). Exact repeats are dropped, and so is a conversation whose
follow-up text is already stored under another main query (the files ask e.g. "What is
market equilibrium?" after two paraphrases of one main query), so that each follow-up has
one stored context. Then these probes are asked:

(a) cross-context: each follow-up asked after a DIFFERENT main query (a deterministic
    derangement that never pairs two mains of the same context);
(b) repeated: each follow-up re-asked after its own main query (the conversation repeats);
(c) generic: unique_u1.json follow-ups ("Can you explain more?") after random main queries;
(d) standalone: unique_u0.json questions asked as first turns (no context).

Two main queries are the same context when their texts are equal or when the files give
them an identical follow-up (paraphrases such as "What are the principles of Confucianism?"
and "What are the main principles of Confucianism?"). A hit on a follow-up entry is true
when that entry was stored under the same context as the probe's previous turn, and false
otherwise (including a probe with no previous turn at all). A hit on a first-turn entry
needs no context to be right, so it is counted on its own ("first-turn hits") and left out
of precision = true / (true + false).
Recall is that of the repeated conversations (b): true hits / probes.

PCA is off (pca_dims=0) and tau is the cache's default global threshold unless
--threshold says otherwise. Run from the repository root (about a minute):

    python benchmarks/context_precision.py
    python benchmarks/context_precision.py --quick
    python benchmarks/context_precision.py --threshold 0.7
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _common import (
    Stopwatch,
    apply_defaults,
    base_parser,
    console,
    fmt,
    heading,
    load_encoder,
    load_json,
    make_table,
    note,
    print_command,
    print_table,
    sample,
)
from meancache.client.cache import CacheSettings, Context, Hit, SemanticCache
from meancache.shared.encoder import BACKENDS, Encoder
from meancache.shared.threshold import DEFAULT_THRESHOLD

CONVERSATION_FILES = ("contextual_queries.json", "d1.json")


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="the cache's similarity threshold tau")
    parser.add_argument("--conversations", type=int,
                        help="conversations to store (deterministic sample; default: all, "
                             "--quick 40)")
    parser.add_argument("--generic", type=int,
                        help="unique_u1 generic follow-ups to probe (default: all, --quick 20; "
                             "0: none)")
    parser.add_argument("--standalone", type=int,
                        help="unique_u0 standalone queries to probe (default: all, --quick 20; "
                             "0: none)")
    parser.add_argument("--backend", choices=BACKENDS, default="onnx",
                        help="encoder backend of the cache")
    args = parser.parse_args()
    return apply_defaults(
        args,
        full={"conversations": 0, "generic": -1, "standalone": -1},
        quick={"conversations": 40, "generic": 20, "standalone": 20},
    )


# data ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Conversation:
    main: str
    main_answer: str
    follow: str
    follow_answer: str


@dataclass(frozen=True)
class Dataset:
    conversations: list[Conversation]  # what is stored: one per follow-up text
    context: dict[str, int]  # main query text -> context id (paraphrases share one)
    repeats: int  # exact (main, follow-up) repeats dropped
    shared: int  # conversations dropped because their follow-up was already stored


def load_dataset(directory: Path) -> Dataset:
    rows = [
        Conversation(row["Main Query"].strip(), row["Main Query Response"],
                     row["Follow-Up Query"].strip(), row["Follow Up Query Response"])
        for name in CONVERSATION_FILES for row in load_json(directory / name)
    ]
    distinct = first_by(rows, lambda c: (c.main, c.follow))
    by_follow = first_by(distinct, lambda c: c.follow)
    return Dataset(by_follow, context_ids(distinct), len(rows) - len(distinct),
                   len(distinct) - len(by_follow))


def context_ids(convs: list[Conversation]) -> dict[str, int]:
    """Connected components of main queries linked by an identical follow-up."""
    mains_of: dict[str, set[str]] = {}
    follows_of: dict[str, set[str]] = {}
    for c in convs:
        mains_of.setdefault(c.follow, set()).add(c.main)
        follows_of.setdefault(c.main, set()).add(c.follow)
    context: dict[str, int] = {}
    for component, start in enumerate(follows_of):
        todo = [start]
        while todo:
            main = todo.pop()
            if main not in context:
                context[main] = component
                todo += [m for f in follows_of[main] for m in mains_of[f]]
    return context


def first_by(items: list[Conversation], key: Callable[[Conversation], Hashable]
             ) -> list[Conversation]:
    """Items in order, keeping only the first of those with equal keys."""
    seen: set[Hashable] = set()
    kept = []
    for item in items:
        if key(item) not in seen:
            seen.add(key(item))
            kept.append(item)
    return kept


def limit(items: Sequence[str], n: int, seed: int) -> list[str]:
    """n < 0: all; otherwise a deterministic sample of n."""
    return list(items) if n < 0 else sample(items, n, seed)


def derangement(keys: Sequence[Hashable], seed: int) -> list[int]:
    """For each i an index j with keys[j] != keys[i]: a seeded permutation rotated by one,
    stepping further along where neighbours share a key."""
    order = list(range(len(keys)))
    random.Random(seed).shuffle(order)
    partner = [0] * len(keys)
    for pos, i in enumerate(order):
        for step in range(1, len(order)):
            j = order[(pos + step) % len(order)]
            if keys[j] != keys[i]:
                partner[i] = j
                break
        else:
            raise ValueError("every item has the same key: no derangement exists")
    return partner


# probes -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Probe:
    query: str
    prev_query: str | None  # the previous turn, None for a first turn


@dataclass(frozen=True)
class Stored:
    turn: int
    main: str | None  # the main query a follow-up entry was stored under
    context: int | None  # its context id


@dataclass
class Counts:
    probes: int = 0
    hits: int = 0
    true: int = 0
    false: int = 0
    first_turn: int = 0
    examples: dict[str, list[str]] = field(
        default_factory=lambda: {"false": [], "first-turn": []})

    def add(self, other: Counts) -> None:
        for name in ("probes", "hits", "true", "false", "first_turn"):
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def precision(self) -> float | None:
        judged = self.true + self.false
        return self.true / judged if judged else None


def build_probes(data: Dataset, convs: list[Conversation], generic: list[str],
                 standalone: list[str], seed: int) -> dict[str, list[Probe]]:
    partner = derangement([data.context[c.main] for c in convs], seed)
    rng = random.Random(seed + 1)
    probes = {
        "(a) follow-up after another main": [
            Probe(c.follow, convs[j].main) for c, j in zip(convs, partner, strict=True)],
        "(b) follow-up after its own main": [Probe(c.follow, c.main) for c in convs],
        "(c) generic follow-up (u1), random main": [
            Probe(text, rng.choice(convs).main) for text in generic],
        "(d) standalone (u0), first turn": [Probe(text, None) for text in standalone],
    }
    return {name: items for name, items in probes.items() if items}


def fill(cache: SemanticCache, convs: list[Conversation], context: dict[str, int]
         ) -> dict[str, Stored]:
    """Store every conversation; entry id -> what it was stored under."""
    stored = {}
    for n, conv in enumerate(convs):
        cid = f"conv-{n}"
        main = cache.insert(conv.main, conv.main_answer, Context(cid, 0))
        follow = cache.insert(conv.follow, conv.follow_answer,
                              Context(cid, 1, main.id, conv.main))
        stored[main.id] = Stored(0, None, None)
        stored[follow.id] = Stored(1, conv.main, context[conv.main])
    return stored


def ask(cache: SemanticCache, probes: list[Probe], stored: dict[str, Stored],
        context_of: dict[str, int]) -> Counts:
    counts = Counts(probes=len(probes))
    for n, probe in enumerate(probes):
        context = Context(f"probe-{n}", 0) if probe.prev_query is None \
            else Context(f"probe-{n}", 1, None, probe.prev_query)
        result = cache.lookup(probe.query, context)
        if not isinstance(result, Hit):
            continue
        counts.hits += 1
        entry = stored[result.entry_id]
        if entry.turn == 0:
            counts.first_turn += 1
            counts.examples["first-turn"].append(describe(probe, result, entry))
        elif probe.prev_query is not None and entry.context == context_of[probe.prev_query]:
            counts.true += 1
        else:
            counts.false += 1
            counts.examples["false"].append(describe(probe, result, entry))
    return counts


def describe(probe: Probe, hit: Hit, entry: Stored) -> str:
    stored = "as a first turn" if entry.main is None else f"after {entry.main!r}"
    return (f"{probe.query!r} after {probe.prev_query!r} -> {hit.matched_query!r} "
            f"(stored {stored}, cos {hit.similarity:.3f})")


def run_mode(encoder: Encoder, context_aware: bool, data: Dataset, convs: list[Conversation],
             probes: dict[str, list[Probe]], threshold: float) -> dict[str, Counts]:
    settings = CacheSettings(context_aware=context_aware, pca_dims=0,
                             global_threshold=threshold)
    with tempfile.TemporaryDirectory(prefix="meancache-bench-") as tmp:
        with SemanticCache(Path(tmp) / "cache", encoder, settings) as cache:
            stored = fill(cache, convs, data.context)
            return {name: ask(cache, items, stored, data.context)
                    for name, items in probes.items()}


# output -------------------------------------------------------------------------------
def print_results(results: dict[bool, dict[str, Counts]]) -> None:
    table = make_table(["context_aware", "probe set", "probes", "hits", "true hits",
                        "false hits", "first-turn hits", "precision", "recall"], right_from=2)
    for aware, by_set in results.items():
        total = Counts()
        for name, c in by_set.items():
            total.add(c)
            recall = fmt(c.true / c.probes) if name.startswith("(b)") else "-"
            table.add_row(str(aware), name, str(c.probes), str(c.hits), str(c.true),
                          str(c.false), str(c.first_turn), fmt(c.precision), recall)
        table.add_row(str(aware), "all probes", str(total.probes), str(total.hits),
                      str(total.true), str(total.false), str(total.first_turn),
                      fmt(total.precision), "-", end_section=True)
    print_table(table)


def print_examples(results: dict[bool, dict[str, Counts]], shown: int = 3) -> None:
    for aware, by_set in results.items():
        for kind in ("false", "first-turn"):
            examples = [e for c in by_set.values() for e in c.examples[kind]]
            if examples:
                console.print(f"{kind} hits with context_aware={aware} ({len(examples)}), "
                              f"e.g.:")
                for line in examples[:shown]:
                    console.print(f"  {line}")


def main() -> None:
    args = parse_args()
    clock = Stopwatch()
    directory = args.data_dir / "contextual"
    data = load_dataset(directory)
    convs = sample(data.conversations, args.conversations or None, args.seed)
    generic = limit(load_json(directory / "unique_u1.json"), args.generic, args.seed)
    standalone = limit(load_json(directory / "unique_u0.json"), args.standalone, args.seed)
    probes = build_probes(data, convs, generic, standalone, args.seed)
    encoder = load_encoder(args.backend, args.cache_dir)
    results = {}
    for aware in (True, False):
        note(f"context_aware={aware}: storing {len(convs)} conversations and probing ...")
        results[aware] = run_mode(encoder, aware, data, convs, probes, args.threshold)

    heading(f"Context precision: {len(convs)} conversations stored ({2 * len(convs)} "
            f"entries; {data.repeats} exact repeats and {data.shared} with an already stored "
            f"follow-up dropped; {len(set(data.context.values()))} distinct contexts), tau "
            f"{args.threshold}, full {encoder.dim}-d ({encoder.backend}), no PCA")
    print_results(results)
    print_examples(results)
    print_command()
    console.print(f"wall time: {clock.seconds:.1f} s")


if __name__ == "__main__":
    main()
