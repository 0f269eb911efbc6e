"""Near-misses: how often the cache serves the answer of a question that only looks the same,
with the rule verifier (``verifier = "rules"``, ``CacheSettings.verify_hits``) off and on;
benchmarks/verification.py compares it with the learned verifier, the default.

Three tables per encoder (MiniLM and MPNet by default), each at the encoder profile's
shipped tau:

1. the near-miss set tests/data/near_miss.jsonl (look-alike pairs that need different
   answers, by kind, and true paraphrases): a real on-disk SemanticCache stores one side
   and is asked the other; "served" = a Hit. Target: at most 10% of the near-misses served
   with verification on.
2. QQP dev: precision, recall, F1, F0.5 of "cosine >= tau and not vetoed" against "cosine
   >= tau", at the shipped tau and (oracle) at each one's best tau on dev. Targets: recall
   drops by at most 0.02 and F0.5 rises at the shipped tau. The guard's rules were tuned
   on dev pairs above tau, so the same table on a --train-pairs sample checks them on
   pairs they were not tuned on.
3. lookup latency: a real cache of --entries questions (QQP train, plus the first q1 of
   --queries dev duplicates); re-asked stored questions (exact repeats: the guard returns at
   once), the dev duplicates' q2 (the guard runs in full on every candidate) and unseen
   questions, verification off and on interleaved
   query by query so that machine load hits both alike. Target: p50 grows by at most 5 ms.
   The guard alone is also timed on every dev pair at or above tau.

QQP embeddings are cached under --cache-dir (see match_quality.py). Run from the
repository root:

    python benchmarks/near_miss.py                    # MiniLM and MPNet
    python benchmarks/near_miss.py --encoders minilm --quick
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (
    REPO_ROOT,
    Latency,
    Stopwatch,
    apply_defaults,
    base_parser,
    console,
    embed_cached,
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
    qqp_questions,
    sample,
)
from meancache.client.cache import CacheSettings, Context, Hit, SemanticCache
from meancache.client.cache.entry import STORED_DTYPE, Entry
from meancache.client.matching.rules import verify
from meancache.shared.encoder import Encoder, profile_threshold
from meancache.shared.threshold import MatchScores, best_threshold, score_thresholds

NEAR_MISS_FILE = REPO_ROOT / "tests" / "data" / "near_miss.jsonl"
MAX_SERVED = 0.10
MAX_RECALL_DROP = 0.02
MAX_P50_GROWTH_MS = 5.0


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__)
    parser.add_argument("--encoders", nargs="+", default=["minilm", "mpnet"],
                        help="encoder profiles ('minilm', 'mpnet') or local model directories")
    parser.add_argument("--near-miss", type=Path, default=NEAR_MISS_FILE,
                        help="JSONL of q1, q2, label (0 near-miss, 1 paraphrase), kind")
    parser.add_argument("--dev-pairs", type=int,
                        help="QQP dev pairs scored (default: all 9,636; --quick 1000)")
    parser.add_argument("--train-pairs", type=int,
                        help="QQP train pairs also scored, a check on pairs the guard's rules "
                             "were not tuned on (default 5000, --quick 0: none)")
    parser.add_argument("--entries", type=int,
                        help="QQP train questions in the latency cache (default 2000, "
                             "--quick 300)")
    parser.add_argument("--queries", type=int,
                        help="timed lookups per probe kind and setting (default 200, "
                             "--quick 30)")
    args = parser.parse_args()
    return apply_defaults(
        args, full={"dev_pairs": 0, "train_pairs": 5000, "entries": 2000, "queries": 200},
        quick={"dev_pairs": 1000, "train_pairs": 0, "entries": 300, "queries": 30})


# near-miss set ----------------------------------------------------------------------------
@dataclass(frozen=True)
class LookAlike:
    cached: str
    asked: str
    label: int  # 0: needs another answer, 1: a paraphrase
    kind: str


def load_near_miss(path: Path) -> list[LookAlike]:
    with path.open(encoding="utf-8") as fh:
        rows = [json.loads(line) for line in fh if line.strip()]
    return [LookAlike(r["q1"], r["q2"], int(r["label"]), r["kind"]) for r in rows]


def served(encoder: Encoder, tau: float, pairs: list[LookAlike], verify_hits: bool
           ) -> list[bool]:
    """For each pair: store ``cached`` in an empty cache, ask ``asked``; True if served."""
    settings = CacheSettings(global_threshold=tau, pca_dims=0, verify_hits=verify_hits,
                             verifier="rules")
    out = []
    with tempfile.TemporaryDirectory(prefix="meancache-near-miss-") as tmp, \
            SemanticCache(Path(tmp), encoder, settings) as cache:
        for pair in pairs:
            cache.clear()
            cache.insert(pair.cached, f"the answer to: {pair.cached}", Context())
            out.append(isinstance(cache.lookup(pair.asked, Context()), Hit))
    return out


def near_miss_table(encoder: Encoder, tau: float, pairs: list[LookAlike]) -> float:
    """Print served rates by kind; return the near-miss served rate with verification."""
    texts = [p.cached for p in pairs] + [p.asked for p in pairs]
    vectors = encoder.encode(texts)
    n = len(pairs)
    cosines = (vectors[:n] * vectors[n:]).sum(1)
    off = served(encoder, tau, pairs, verify_hits=False)
    on = served(encoder, tau, pairs, verify_hits=True)
    kinds = list(dict.fromkeys(p.kind for p in pairs if p.label == 0)) + ["paraphrase"]
    table = make_table(["kind", "pairs", "median cosine", "cosine >= tau",
                        "served, verification off", "served, verification on",
                        "vetoed (on)"], right_from=1)

    def row(name: str, chosen: list[int]) -> None:
        k = max(len(chosen), 1)
        vetoes = Counter(v.kind for i in chosen if cosines[i] >= tau and off[i] and not on[i]
                         for v in [verify(pairs[i].asked, pairs[i].cached)] if v)
        table.add_row(name, str(len(chosen)), fmt(float(np.median(cosines[chosen]))),
                      pct(sum(cosines[i] >= tau for i in chosen) / k),
                      pct(sum(off[i] for i in chosen) / k), pct(sum(on[i] for i in chosen) / k),
                      ", ".join(f"{kind} {c}" for kind, c in vetoes.most_common()) or "-")

    for kind in kinds:
        row(kind, [i for i, p in enumerate(pairs) if p.kind == kind])
    near = [i for i, p in enumerate(pairs) if p.label == 0]
    row("all near-misses", near)
    print_table(table)
    still = [pairs[i] for i in near if on[i]]
    for pair in still:
        console.print(f"  still served: {pair.kind}: {pair.cached!r} -> {pair.asked!r}")
    for i, pair in enumerate(pairs):
        if pair.label == 1 and off[i] and not on[i]:
            veto = verify(pair.asked, pair.cached)
            console.print(f"  paraphrase vetoed: {pair.cached!r} -> {pair.asked!r} "
                          f"({veto.reason if veto else '?'})")
    return sum(on[i] for i in near) / max(len(near), 1)


# QQP dev ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class QQPScores:
    shipped_off: MatchScores
    shipped_on: MatchScores
    best_off: MatchScores
    best_on: MatchScores
    guard: Latency  # one verify() call


def qqp_scores(encoder: Encoder, tau: float, split: str, n_pairs: int | None,
               args: argparse.Namespace) -> QQPScores:
    pairs = sample(load_qqp(args.data_dir, split), n_pairs, args.seed)
    texts = qqp_questions(pairs)
    row = {t: i for i, t in enumerate(texts)}
    vectors = embed_cached(encoder, texts, args.cache_dir)
    sims = np.array([vectors[row[p.q1]] @ vectors[row[p.q2]] for p in pairs])
    labels = np.array([p.label for p in pairs])
    checked = np.flatnonzero(sims >= min(tau, best_threshold(sims, labels).threshold) - 0.05)
    vetoed = np.zeros(len(pairs), dtype=bool)
    seconds = []
    for i in checked:  # the cached question is q1, the asked one q2
        started = time.perf_counter()
        vetoed[i] = verify(pairs[i].q2, pairs[i].q1) is not None
        seconds.append(time.perf_counter() - started)
    verified = np.where(vetoed, -1.0, sims)
    at = np.array([tau])
    return QQPScores(score_thresholds(sims, labels, at)[0],
                     score_thresholds(verified, labels, at)[0],
                     best_threshold(sims, labels), best_threshold(verified, labels),
                     Latency.of(seconds))


def qqp_table(scores: QQPScores, split: str) -> None:
    table = make_table(["tau", "verification", "tau value", "precision", "recall", "F1",
                        "F0.5", "Δrecall", "ΔF0.5"], right_from=2)
    rows = (("shipped", scores.shipped_off, scores.shipped_on),
            ("best on these pairs (oracle)", scores.best_off, scores.best_on))
    for name, off, on in rows:
        for label, s in (("off", off), ("on", on)):
            table.add_row(name, label, f"{s.threshold:.4f}", fmt(s.precision), fmt(s.recall),
                          fmt(s.f1), fmt(s.f05),
                          "-" if s is off else f"{on.recall - off.recall:+.3f}",
                          "-" if s is off else f"{on.f05 - off.f05:+.3f}")
    console.print(f"QQP {split}, {scores.shipped_off.pairs:,} pairs")
    print_table(table)


# latency ----------------------------------------------------------------------------------
def latency_rows(encoder: Encoder, tau: float, args: argparse.Namespace
                 ) -> list[tuple[str, Latency, Latency, int, int]]:
    """(probe, p50/p99 off, on, hits off, hits on), lookups interleaved off/on."""
    dev = load_qqp(args.data_dir, "dev")
    duplicates = [p for p in dev if p.label == 1][: args.queries]
    train = qqp_questions(sample(load_qqp(args.data_dir, "train"), args.entries, args.seed))
    entries = train[: args.entries - len(duplicates)] + [p.q1 for p in duplicates]
    stored = set(entries)
    unseen = [t for t in qqp_questions(dev[-args.queries * 2:]) if t not in stored]
    probes = {"stored question re-asked": train[: args.queries],
              "QQP duplicate of a stored question": [p.q2 for p in duplicates],
              "unseen question": unseen[: args.queries]}
    vectors = embed_cached(encoder, entries, args.cache_dir)
    out = []
    with tempfile.TemporaryDirectory(prefix="meancache-near-miss-") as tmp:
        directory = Path(tmp)
        with SemanticCache(directory, encoder, CacheSettings(global_threshold=tau,
                                                             pca_dims=0)) as cache:
            cache.store.put_many([
                Entry(query=q, answer=f"the answer to: {q}", embedding=v.astype(STORED_DTYPE),
                      encoder_version=encoder.version, query_tokens=1, answer_tokens=1)
                for q, v in zip(entries, vectors, strict=True)])
        caches = {flag: SemanticCache(directory, encoder, CacheSettings(
            global_threshold=tau, pca_dims=0, verify_hits=flag)) for flag in (False, True)}
        try:
            for name, texts in probes.items():
                seconds: dict[bool, list[float]] = {False: [], True: []}
                hits = {False: 0, True: 0}
                for text in texts[:5]:  # warm-up, untimed
                    for cache in caches.values():
                        cache.lookup(text, Context())
                for i, text in enumerate(texts):
                    for flag in (False, True) if i % 2 else (True, False):  # alternate
                        cache = caches[flag]
                        started = time.perf_counter()
                        result = cache.lookup(text, Context())
                        seconds[flag].append(time.perf_counter() - started)
                        hits[flag] += isinstance(result, Hit)
                out.append((name, Latency.of(seconds[False]), Latency.of(seconds[True]),
                            hits[False], hits[True]))
        finally:
            for cache in caches.values():
                cache.close()
    return out


def latency_table(rows: list[tuple[str, Latency, Latency, int, int]], guard: Latency,
                  entries: int) -> float:
    table = make_table(["probe", "lookups", "hits off / on", "p50 off (ms)", "p50 on (ms)",
                        "Δp50 (ms)", "p99 off (ms)", "p99 on (ms)"], right_from=1)
    for name, off, on, hits_off, hits_on in rows:
        table.add_row(name, str(off.n), f"{hits_off} / {hits_on}", f"{off.p50:.2f}",
                      f"{on.p50:.2f}", f"{on.p50 - off.p50:+.2f}", f"{off.p99:.2f}",
                      f"{on.p99:.2f}")
    console.print(f"SemanticCache.lookup on a real cache of {entries:,} entries "
                  f"(verification off and on interleaved)")
    print_table(table)
    console.print(f"verify() alone over {guard.n:,} dev pairs near tau: p50 "
                  f"{guard.p50 * 1000:.1f} µs, p99 {guard.p99 * 1000:.1f} µs, "
                  f"mean {guard.mean * 1000:.1f} µs")
    return max(on.p50 - off.p50 for _, off, on, _, _ in rows)


def main() -> None:
    args = parse_args()
    clock = Stopwatch()
    pairs = load_near_miss(args.near_miss)
    console.print(machine_load())
    verdicts = []
    for model in args.encoders:
        encoder = load_encoder("onnx", args.cache_dir, model=model)
        tau = profile_threshold(model)
        heading(f"encoder {model} ({encoder.version}, {encoder.dim}-d), shipped tau {tau}")
        note("near-miss set ...")
        near = near_miss_table(encoder, tau, pairs)
        note("QQP dev ...")
        scores = qqp_scores(encoder, tau, "dev", args.dev_pairs or None, args)
        qqp_table(scores, "dev")
        if args.train_pairs:
            note("QQP train sample ...")
            qqp_table(qqp_scores(encoder, tau, "train", args.train_pairs, args),
                      "train sample (the rules were not tuned on it)")
        note("lookup latency ...")
        growth = latency_table(latency_rows(encoder, tau, args), scores.guard, args.entries)
        drop = scores.shipped_off.recall - scores.shipped_on.recall
        rise = scores.shipped_on.f05 - scores.shipped_off.f05
        verdicts.append((model, near, drop, rise, growth))
    heading("targets (verification on vs off, shipped tau)")
    table = make_table(["encoder", "near-misses served (<= 10%)", "recall drop (<= 0.02)",
                        "ΔF0.5 (> 0)", "Δp50 (<= 5 ms)", "verdict"], right_from=1)
    for model, near, drop, rise, growth in verdicts:
        ok = near <= MAX_SERVED and drop <= MAX_RECALL_DROP and rise > 0 \
            and growth <= MAX_P50_GROWTH_MS
        table.add_row(model, pct(near), f"{drop:.3f}", f"{rise:+.3f}", f"{growth:+.2f}",
                      "meets" if ok else "MISSES")
    print_table(table)
    console.print(machine_load())
    print_command()
    console.print(f"wall time: {clock.seconds:.1f} s")


if __name__ == "__main__":
    main()
