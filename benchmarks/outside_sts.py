"""The cache's decisions on statements nobody here wrote: the STS benchmark's pairs
(``_sts``: free-text genres only), replayed as issue 35's hidden benchmark is (every first
sentence stored with an answer of its own, every second one asked).

A hit is judged by the benchmark's own scores, grouped as ``client.eval_stream`` groups a
stream (sentences joined by pairs scored 4 or more, so a sentence stored twice, or a third
wording of the same scene, counts as its own): *right* when the sentence served is in the
asked one's group, *wrong* when a near-miss pair (scored 2-3) links the two groups, and
*unjudged* when no score relates them (the benchmark rated only the pairs it lists).
Asked separately: the second sentences of one-meaning pairs (the paraphrases: hit rate) and
of the near-miss pairs (near-misses served). Nothing here was tuned on this data.

    python benchmarks/outside_sts.py --sts /tmp/stsbenchmark   # its csv files there

(A snapshot of the files, from GitHub's sudha93/semanticTextualSimilarity, is extracted
with ``git -C SNAPSHOT archive HEAD stsbenchmark | tar -x -C /tmp``.)
"""

from __future__ import annotations

import tempfile
import time
from collections import Counter
from pathlib import Path

from _common import (
    apply_defaults,
    base_parser,
    heading,
    load_encoder,
    make_table,
    note,
    pct,
    print_command,
    print_table,
)
from _sts import labelled, read_sts
from meancache.client.cache import Hit, SemanticCache
from meancache.client.cache.settings import CacheSettings
from meancache.client.eval_stream import stream_of
from meancache.shared.encoder import profile_threshold
from meancache.shared.pairs import Pair
from meancache.shared.query import normalise_query

DECIDERS = {
    "learned": {},  # the shipped default: the learned decision over the verifier
    "rules": {"decision": "rules"},  # the verifier with the hand-made rules around it
    "none": {"verify_hits": False},  # the embedding alone, at the encoder's tau
}


class Judge:
    """Whether serving one sentence for another is right, wrong or unjudged, by the
    benchmark's scores."""

    def __init__(self, pairs: list[Pair]) -> None:
        self.group = {normalise_query(t.question): t.group for t in stream_of(pairs, 0)}
        self.apart = {frozenset((self.of(p.q1), self.of(p.q2))) for p in pairs if not p.label}

    def of(self, text: str) -> int:
        return self.group[normalise_query(text)]

    def __call__(self, asked: str, served: str) -> str:
        a, s = self.of(asked), self.of(served)
        if a == s:
            return "right"
        return "wrong" if frozenset((a, s)) in self.apart else "unjudged"


def replay(pairs: list[Pair], judge: Judge, cache: SemanticCache) -> dict[int, Counter]:
    """Store every q1 (its answer names it), ask every q2; outcomes by the pair's label."""
    stored: set[str] = set()
    for pair in pairs:
        if normalise_query(pair.q1) not in stored:
            stored.add(normalise_query(pair.q1))
            cache.insert(pair.q1, pair.q1)
    outcomes: dict[int, Counter] = {1: Counter(), 0: Counter()}
    for pair in pairs:
        result = cache.lookup(pair.q2)
        outcome = judge(pair.q2, result.answer) if isinstance(result, Hit) else "miss"
        outcomes[pair.label][outcome] += 1
    return outcomes


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--sts", type=Path, required=True,
                        help="the folder of the STS benchmark's sts-{train,dev,test}.csv")
    parser.add_argument("--encoder", default="mpnet", help="encoder profile (the product's)")
    parser.add_argument("--backend", default="onnx-int8", help="the encoder's backend "
                        "(the product's default)")
    parser.add_argument("--deciders", nargs="+", default=list(DECIDERS),
                        choices=list(DECIDERS))
    parser.add_argument("--limit", type=int, help="use the first N labelled pairs (0: all; "
                        "default: all, 200 with --quick)")
    args = apply_defaults(parser.parse_args(), {"limit": 0}, {"limit": 200})
    print_command()
    scored = read_sts(args.sts)
    pairs = labelled(scored)[: args.limit or None]
    judge = Judge(pairs)
    genres = Counter(p.genre for p in scored)
    note(f"{len(scored)} free-text pairs read ({dict(genres)}); {sum(p.label for p in pairs)} "
         f"of one meaning, {sum(not p.label for p in pairs)} near-misses, "
         f"{len(set(judge.group.values()))} groups")
    encoder = load_encoder(args.backend, args.cache_dir, model=args.encoder)
    settings = CacheSettings(pca_dims=0, global_threshold=profile_threshold(args.encoder))
    table = make_table(["decision", "asked", "served right", "served wrong", "unjudged",
                        "miss", "hit rate", "precision of judged hits", "wrong of asked",
                        "s"], right_from=2)
    for name in args.deciders:
        started = time.perf_counter()
        with tempfile.TemporaryDirectory() as directory, \
                SemanticCache(Path(directory), encoder,
                              settings.model_copy(update=DECIDERS[name])) as cache:
            outcomes = replay(pairs, judge, cache)
        seconds = f"{time.perf_counter() - started:.0f}"
        for label, kind in ((1, "paraphrases"), (0, "near-misses")):
            c = outcomes[label]
            asked = sum(c.values())
            judged = c["right"] + c["wrong"]
            table.add_row(name, f"{kind}: {asked}", str(c["right"]), str(c["wrong"]),
                          str(c["unjudged"]), str(c["miss"]),
                          pct((asked - c["miss"]) / asked if asked else None),
                          pct(c["right"] / judged if judged else None),
                          pct(c["wrong"] / asked if asked else None), seconds)
    heading(f"STS benchmark, free-text genres ({args.encoder}, {args.backend}): every first "
            "sentence stored, every second asked")
    print_table(table)


if __name__ == "__main__":
    main()
