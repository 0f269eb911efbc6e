"""SCALM policies: hit ratio, token saving ratio and hit precision of LRU, LFU, CO-HSC-LFU
and SE-HSC-LFU when query streams are replayed through the real SemanticCache.

There are no real multi-turn chat logs here, so streams are generated (per seed) from
../shared/data:

- popular questions: ``--popular`` duplicate pairs (label 1, distinct questions) of the QQP
  file; each has a Zipf popularity (weight 1 / rank^``--zipf``, ranks shuffled by the seed)
  and every occurrence asks one of its two labelled phrasings at random, so a popular
  question recurs as its labelled duplicate;
- one-off instructions: Chatbot Arena and ShareGPT first turns (instructions/), each asked
  once and never again;
- conversations: main query + follow-up pairs of contextual/ (both files), with their own
  Zipf popularity; an occurrence asks the main query (round 1), then the follow-up (round
  2) in that context.

Each step draws a popular question, a one-off or a conversation with probabilities
``--mix`` until the stream holds ``--queries`` queries. Every query is looked up (with its
conversational context); a miss stores the query with its answer, as the chat does. The
cache decides hits with its own threshold (the encoder profile's default) and its own
context check; only ``max_entries`` (the size) and ``eviction_policy`` change.

Tokens: query tokens are counted with the encoder's tokenizer; answer tokens are those of
the contextual/ answers for conversations and, for QQP questions and instructions (which
have no answers), a fixed estimate: the median answer length of contextual/ (printed). A
follow-up's tokens also include its context (the main query and answer), as in SCALM.
Hit ratio = hits / queries; token saving ratio = tokens of hit queries / tokens of all
queries; hit precision = right hits / hits, a hit being right when the asked and matched
queries are the same text or a pair labelled duplicate in QQP. Clustering time is the
time SCALM's re-clustering took (k-means by default, ``--clustering dbscan`` for the
paper's), per fit and in total per replay.

Means over ``--seeds`` seeds with 95% t-intervals; "vs LFU" is the mean of the per-seed
relative change against LFU on the same stream. Each distinct text is embedded once (and
kept on disk under --cache-dir); re-clustering is awaited after every query so that a run
is deterministic. Run from the repository root:

    python benchmarks/scalm_policies.py                 # MiniLM, about 10 minutes
    python benchmarks/scalm_policies.py --encoder mpnet
    python benchmarks/scalm_policies.py --quick
"""

from __future__ import annotations

import argparse
import json
import random
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from _common import (
    apply_defaults,
    base_parser,
    console,
    embed_cached,
    heading,
    load_encoder,
    load_json,
    load_qqp,
    make_table,
    note,
    pct,
    print_command,
    print_table,
    unique,
)
from meancache.client.cache import CacheSettings, Context, Hit, SemanticCache
from meancache.client.cache.policy import CLUSTERINGS
from meancache.shared.encoder import Encoder, profile_threshold
from scipy import stats

POLICIES = ("lru", "lfu", "scalm-co", "scalm-se")
POLICY_NAMES = {"lru": "LRU", "lfu": "LFU", "scalm-co": "CO-HSC-LFU", "scalm-se": "SE-HSC-LFU"}
CONVERSATION_FILES = ("contextual_queries.json", "d1.json")
INSTRUCTION_FILES = ("arena_first_turns.jsonl", "sharegpt_first_turns.jsonl")


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__)
    parser.add_argument("--encoder", choices=("minilm", "mpnet"), default="minilm",
                        help="the cache's encoder (its profile's default threshold is used)")
    parser.add_argument("--sizes", type=int, nargs="+", help="cache sizes in entries "
                        "(default: 20 50 100 200, --quick 20 50)")
    parser.add_argument("--seeds", type=int, help="streams per size (default 10, --quick 2)")
    parser.add_argument("--queries", type=int, help="queries per stream (default 1000, "
                        "--quick 300)")
    parser.add_argument("--popular", type=int, default=300, help="popular QQP questions")
    parser.add_argument("--zipf", type=float, default=1.0, help="Zipf exponent of popularity")
    parser.add_argument("--mix", type=float, nargs=3, default=(0.45, 0.40, 0.15),
                        metavar=("POPULAR", "ONE_OFF", "CONVERSATION"),
                        help="probabilities of each kind of step")
    parser.add_argument("--pool", type=int, default=1000, help="QQP pairs and instructions "
                        "of each file the seeds draw from (bounds the texts to embed)")
    parser.add_argument("--clustering", choices=CLUSTERINGS, default="kmeans",
                        help="how SCALM's patterns are clustered")
    return apply_defaults(parser.parse_args(),
                          {"sizes": [20, 50, 100, 200], "seeds": 10, "queries": 1000},
                          {"sizes": [20, 50], "seeds": 2, "queries": 300})


# data ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    text: str
    answer_tokens: int
    conversation: str | None = None  # set on both rounds of a conversation
    round_: int = 0
    context: Query | None = None  # the main query of a follow-up


@dataclass
class Pools:
    """What the streams are drawn from, and the labelled duplicates that judge hits."""

    pairs: list[tuple[str, str]]
    instructions: list[str]
    conversations: list[tuple[Query, Query]]
    duplicates: set[frozenset[str]]
    answer_estimate: int


def load_pools(data_dir: Path, encoder: Encoder, pool: int, seed: int) -> Pools:
    qqp = load_qqp(data_dir)
    duplicates = {frozenset((p.q1, p.q2)) for p in qqp if p.label == 1}
    seen: set[str] = set()
    pairs: list[tuple[str, str]] = []
    for p in random.Random(seed).sample([p for p in qqp if p.label == 1], 4 * pool):
        if p.q1 != p.q2 and not {p.q1, p.q2} & seen and len(pairs) < pool:
            pairs.append((p.q1, p.q2))
            seen |= {p.q1, p.q2}
    instructions: list[str] = []
    for name in INSTRUCTION_FILES:
        with (data_dir / "instructions" / name).open(encoding="utf-8") as fh:
            texts = [str(json.loads(line)["text"]).strip() for line in fh if line.strip()]
        instructions += random.Random(seed).sample([t for t in unique(texts) if t], pool)
    instructions = [t for t in unique(instructions) if t not in seen]
    raw = [c for name in CONVERSATION_FILES for c in load_json(data_dir / "contextual" / name)]
    answers = [encoder.count_tokens(c[k]) for c in raw
               for k in ("Main Query Response", "Follow Up Query Response")]
    conversations: dict[tuple[str, str], tuple[Query, Query]] = {}
    for i, c in enumerate(raw):
        key = (c["Main Query"].strip(), c["Follow-Up Query"].strip())
        main = Query(key[0], encoder.count_tokens(c["Main Query Response"]), f"c{i}", 0)
        follow = Query(key[1], encoder.count_tokens(c["Follow Up Query Response"]), f"c{i}", 1,
                       main)
        conversations.setdefault(key, (main, follow))
    return Pools(pairs, instructions, list(conversations.values()), duplicates,
                 int(np.median(answers)))


def zipf_weights(count: int, exponent: float, rng: np.random.Generator) -> np.ndarray:
    weights = 1.0 / np.arange(1, count + 1) ** exponent
    return rng.permutation(weights / weights.sum())


def make_stream(pools: Pools, args: argparse.Namespace, seed: int) -> list[Query]:
    """One seeded stream (see the module's docstring)."""
    rng = np.random.default_rng(seed)
    pairs = [pools.pairs[i] for i in rng.choice(len(pools.pairs), args.popular, replace=False)]
    pair_weights = zipf_weights(len(pairs), args.zipf, rng)
    conversation_weights = zipf_weights(len(pools.conversations), args.zipf, rng)
    one_offs = iter(rng.permutation(pools.instructions).tolist())
    mix = np.asarray(args.mix) / sum(args.mix)
    stream: list[Query] = []
    while len(stream) < args.queries:
        kind = rng.choice(3, p=mix)
        if kind == 0:
            pair = pairs[rng.choice(len(pairs), p=pair_weights)]
            stream.append(Query(pair[rng.integers(2)], pools.answer_estimate))
        elif kind == 1:
            stream.append(Query(next(one_offs), pools.answer_estimate))
        else:
            stream.extend(pools.conversations[rng.choice(len(pools.conversations),
                                                         p=conversation_weights)])
    return stream[:args.queries]


# replay -------------------------------------------------------------------------------
class ReplayEncoder:
    """The cache's encoder over vectors computed once for every distinct text of the run:
    the replay measures the policies, not the embedding model's speed."""

    def __init__(self, encoder: Encoder, texts: Sequence[str], vectors: np.ndarray) -> None:
        self.version, self.base_version = encoder.version, encoder.base_version
        self.dim, self.backend, self.pca = encoder.dim, encoder.backend, None
        self._vectors = dict(zip(texts, vectors, strict=True))
        self._tokens = {t: encoder.count_tokens(t) for t in texts}
        self._max_tokens = encoder.max_tokens

    def encode(self, texts: Sequence[str], batch_size: int = 64) -> np.ndarray:
        return np.stack([self._vectors[t] for t in texts])

    def count_tokens(self, text: str) -> int:
        return self._tokens[text]

    def is_truncated(self, text: str) -> bool:
        return self._tokens[text] > self._max_tokens


@dataclass
class Outcome:
    hit_ratio: float
    token_saving: float
    precision: float
    fits: int
    fit_seconds: float


def cost(query: Query, encoder: ReplayEncoder) -> int:
    """Tokens the upstream would handle for ``query``: query, answer and context."""
    own = encoder.count_tokens(query.text) + query.answer_tokens
    return own + (cost(query.context, encoder) if query.context is not None else 0)


def replay(stream: list[Query], encoder: ReplayEncoder, policy: str, size: int,
           threshold: float, clustering: str, duplicates: set[frozenset[str]],
           directory: Path) -> Outcome:
    settings = CacheSettings(global_threshold=threshold, max_entries=size, pca_dims=0,
                             eviction_policy=policy, pattern_clustering=clustering)
    hits = right = saved = total = 0
    last: dict[str, tuple[str, str]] = {}  # conversation -> (entry id, query) of round 1
    with SemanticCache(directory, encoder, settings) as cache:  # type: ignore[arg-type]
        for query in stream:
            context = None
            if query.conversation is not None:
                prev = last.get(query.conversation) if query.round_ else None
                context = Context(query.conversation, query.round_,
                                  prev[0] if prev else None, prev[1] if prev else None)
            tokens = cost(query, encoder)
            total += tokens
            result = cache.lookup(query.text, context)
            cache.policy.wait()
            if isinstance(result, Hit):
                hits += 1
                saved += tokens
                right += result.matched_query == query.text or \
                    frozenset((result.matched_query, query.text)) in duplicates
                entry_id = result.entry_id
            else:
                entry = cache.insert(query.text, f"answer to {query.text}", context,
                                     query_tokens=encoder.count_tokens(query.text),
                                     answer_tokens=query.answer_tokens)
                cache.policy.wait()
                entry_id = entry.id
            if query.conversation is not None and query.round_ == 0:
                last[query.conversation] = (entry_id, query.text)
        fits = cache.policy.fit_seconds
    return Outcome(hits / len(stream), saved / total, right / hits if hits else 0.0,
                   len(fits), sum(fits))


# summary ------------------------------------------------------------------------------
def interval(values: Sequence[float]) -> tuple[float, float]:
    """Mean and the half-width of its 95% t-interval."""
    data = np.asarray(values, dtype=float)
    if len(data) < 2:
        return float(data.mean()), 0.0
    half = stats.t.ppf(0.975, len(data) - 1) * data.std(ddof=1) / np.sqrt(len(data))
    return float(data.mean()), float(half)


def show(values: Sequence[float], percent: bool = True, digits: int = 1) -> str:
    mean, half = interval(values)
    if percent:
        return f"{pct(mean, digits)} ± {100 * half:.{digits}f}"
    return f"{mean:.{digits}f} ± {half:.{digits}f}"


def relative(values: Sequence[float], base: Sequence[float]) -> list[float]:
    return [v / b - 1 if b else 0.0 for v, b in zip(values, base, strict=True)]


@dataclass
class Results:
    outcomes: dict[tuple[int, str], list[Outcome]] = field(default_factory=dict)

    def of(self, size: int, policy: str, name: str) -> list[float]:
        return [getattr(o, name) for o in self.outcomes[(size, policy)]]


def main() -> None:
    args = parse_args()
    encoder = load_encoder("onnx", args.cache_dir, model=args.encoder)
    threshold = profile_threshold(args.encoder)
    pools = load_pools(args.data_dir, encoder, args.pool, args.seed)
    streams = [make_stream(pools, args, args.seed + s) for s in range(args.seeds)]
    texts = unique(q.text for stream in streams for q in stream)
    replay_encoder = ReplayEncoder(encoder, texts, embed_cached(encoder, texts, args.cache_dir))
    note(f"{len(streams)} streams of {args.queries} queries, {len(texts)} distinct texts; "
         f"answer estimate {pools.answer_estimate} tokens; threshold {threshold}")
    results = Results()
    with tempfile.TemporaryDirectory(prefix="scalm-bench-") as tmp:
        for size in args.sizes:
            for policy in POLICIES:
                outcomes = []
                for s, stream in enumerate(streams):
                    outcomes.append(replay(stream, replay_encoder, policy, size, threshold,
                                           args.clustering, pools.duplicates,
                                           Path(tmp) / f"{size}-{policy}-{s}"))
                results.outcomes[(size, policy)] = outcomes
                hit_ratio = show(results.of(size, policy, "hit_ratio"))
                note(f"size {size} {policy}: hit ratio {hit_ratio}")
    print_command()
    heading(f"SCALM policies, {args.encoder} (tau {threshold}), {args.seeds} seeds x "
            f"{args.queries} queries, {args.clustering}; mean ± 95% CI")
    table = make_table(["size", "policy", "hit ratio", "token saving", "hit precision",
                        "hit ratio vs LFU", "token saving vs LFU", "fits",
                        "ms per fit", "fit s per replay"], right_from=2)
    for size in args.sizes:
        lfu_hits = results.of(size, "lfu", "hit_ratio")
        lfu_saving = results.of(size, "lfu", "token_saving")
        for policy in POLICIES:
            fits = results.of(size, policy, "fits")
            seconds = results.of(size, policy, "fit_seconds")
            per_fit = [1000 * s / f for s, f in zip(seconds, fits, strict=True) if f]
            table.add_row(
                str(size), POLICY_NAMES[policy], show(results.of(size, policy, "hit_ratio")),
                show(results.of(size, policy, "token_saving")),
                show(results.of(size, policy, "precision")),
                show(relative(results.of(size, policy, "hit_ratio"), lfu_hits)),
                show(relative(results.of(size, policy, "token_saving"), lfu_saving)),
                f"{np.mean(fits):.0f}" if any(fits) else "-",
                show(per_fit, percent=False) if per_fit else "-",
                show(seconds, percent=False, digits=2) if any(fits) else "-")
    print_table(table)
    console.print(f"answer tokens of QQP questions and instructions: {pools.answer_estimate} "
                  "(median of contextual/ answers)")


if __name__ == "__main__":
    main()
