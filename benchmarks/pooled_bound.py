"""What pooling the error bound's labels across devices buys a device (issue 37, part 2).

A stream of labelled served-region pairs (the asked question, the cache's best candidate,
whether its answer would be wrong), each scored by the shipped verifier (the bound's
judge), is split across N simulated devices in a seeded order. Two streams:

- ``qqp``: QQP dev pairs as they stand (a pair whose questions differ is a wrong answer);
- ``arena``: Chatbot Arena first turns, each asked in a code-made paraphrase
  (learning_stream.paraphrase) of a cache holding the originals of half of them: the
  verifier picks the best of the five stored questions nearest by MiniLM cosine, and its
  answer is wrong unless it is the paraphrase's own original. Each device in turn
is held out: it has learned the labels of the first half of its traffic and is measured on
the second half, at the threshold its bound chooses (client.learning.bound)

- from its own labels alone (``choose``), and
- from its own labels together with the other devices' pooled evidence, as the FL server
  publishes it (shared.fl.bound_evidence: all of each other device's labels, binned, each
  device capped at the round's median as screening does; ``choose_pooled``).

It reports, over the held-out devices, the median threshold, the hit rate (the share of
its test questions answered from the cache), the wrong rate (the share of served answers
that are wrong, which the bound holds at ``max_wrong_rate``), and how many devices served
more wrong answers than the bound. Pair-level: every pair is labelled (labelled_with 1),
as the misses a device compares and the hits it explores are.

    python benchmarks/pooled_bound.py                    # 4,000 labels a stream, 5 and 20 devices
    python benchmarks/pooled_bound.py --quick
"""

import json
import random

import numpy as np
from _common import base_parser, embed_cached, load_encoder, load_qqp, note, print_table, sample
from learning_stream import paraphrase
from meancache.client.learning.bound import Label, Rows, choose, choose_pooled
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.verifier.runtime import LearnedVerifier
from rich.table import Table


def scored_pairs(data_dir, pairs: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(verifier probability, wrong) of ``pairs`` QQP dev pairs."""
    chosen = sample(load_qqp(data_dir, "dev"), pairs, seed)
    verifier = LearnedVerifier.load()
    note(f"scoring {len(chosen)} QQP dev pairs with the shipped verifier")
    scores = verifier.pair_probabilities([p.q2 for p in chosen], [p.q1 for p in chosen])
    return scores.astype(float), np.array([p.label == 0 for p in chosen])


def arena_pairs(data_dir, cache_dir, questions: int, seed: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(verifier probability of the best candidate, wrong) of ``questions`` paraphrased
    Arena questions against a cache holding half of their originals."""
    rows = [json.loads(line)["text"] for line in
            (data_dir / "instructions" / "arena_first_turns.jsonl").open()]
    rng = random.Random(seed)
    rows = list(dict.fromkeys(r for r in rows if 3 <= len(r.split()) <= 40))
    rng.shuffle(rows)
    originals = rows[:questions]
    asked = [paraphrase(r, rng) for r in originals]
    stored = sorted(rng.sample(range(len(originals)), len(originals) // 2))
    encoder = load_encoder("onnx", cache_dir)
    kept = embed_cached(encoder, [originals[i] for i in stored], cache_dir)
    queries = embed_cached(encoder, asked, cache_dir)
    nearest = np.argsort(-(queries @ kept.T), axis=1)[:, :5]
    verifier = LearnedVerifier.load()
    note(f"judging {len(asked)} paraphrased Arena questions' five nearest stored questions")
    scores, wrong = [], []
    for i, candidates in enumerate(nearest):
        probabilities = verifier.probabilities(asked[i], [originals[stored[c]]
                                                          for c in candidates])
        best = int(np.argmax(probabilities))
        scores.append(float(probabilities[best]))
        wrong.append(stored[candidates[best]] != i)
    return np.array(scores), np.array(wrong)


def evidence(scores: np.ndarray, wrong: np.ndarray) -> BoundEvidence:
    return BoundEvidence.of_labels(scores, wrong.astype(float), np.ones(len(scores)))


def served(threshold: float, scores: np.ndarray, wrong: np.ndarray) -> tuple[float, float]:
    """(hit rate, wrong share of the served) on a device's test traffic."""
    hits = scores >= threshold
    return float(hits.mean()), float(wrong[hits].mean()) if hits.any() else 0.0


def held_out(scores: np.ndarray, wrong: np.ndarray, devices: int, rate: float, prior: float,
             seed: int) -> dict[str, list[float]]:
    order = np.array(random.Random(seed).sample(range(len(scores)), len(scores)))
    shards = np.array_split(order, devices)
    shared = [evidence(scores[s], wrong[s]) for s in shards]
    out: dict[str, list[float]] = {k: [] for k in ("own_t", "own_hit", "own_wrong",
                                                   "pool_t", "pool_hit", "pool_wrong",
                                                   "pool_labels")}
    for d, shard in enumerate(shards):
        learned, test = shard[: len(shard) // 2], shard[len(shard) // 2:]
        own = [Label(float(scores[i]), bool(wrong[i])) for i in learned]
        others = [e for i, e in enumerate(shared) if i != d]
        cap = float(np.median([e.labels for e in others]))
        pool = sum((e.at_most(cap) for e in others), BoundEvidence.empty())
        alone = choose(own, rate, prior)
        pooled = choose_pooled(own, own, Rows.pooled_bins(*pool.rows()), rate, prior)
        for key, bound in (("own", alone), ("pool", pooled)):
            hit, wrong_share = served(bound.threshold, scores[test], wrong[test])
            out[f"{key}_t"].append(min(bound.threshold, 1.0))
            out[f"{key}_hit"].append(hit)
            out[f"{key}_wrong"].append(wrong_share)
        out["pool_labels"].append(pool.labels)
    return out


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--pairs", type=int, default=4000, help="labels in each stream")
    parser.add_argument("--streams", nargs="+", default=["qqp", "arena"])
    parser.add_argument("--devices", type=int, nargs="+", default=[5, 20])
    parser.add_argument("--rates", type=float, nargs="+", default=[0.02, 0.05, 0.1],
                        help="max_wrong_rate values")
    args = parser.parse_args()
    if args.quick:
        args.pairs, args.devices, args.rates = 800, [4], [0.05]
    prior = LearnedVerifier.load().threshold
    for stream in args.streams:
        scores, wrong = (scored_pairs(args.data_dir, args.pairs, args.seed) if stream == "qqp"
                         else arena_pairs(args.data_dir, args.cache_dir, args.pairs, args.seed))
        note(f"{stream}: prior (the verifier card's threshold) {prior:.3f}; the stream is "
             f"{wrong.mean():.1%} wrong over all labels, {wrong[scores >= prior].mean():.1%} "
             f"over the prior")
        report(stream, scores, wrong, prior, args)


def report(stream: str, scores: np.ndarray, wrong: np.ndarray, prior: float, args) -> None:
    table = Table(title=f"{stream}: held-out devices at the bound, own labels vs the pool "
                  f"({len(scores)} labels scored by the shipped verifier, seed {args.seed}; "
                  f"medians over devices, wrong = share of served answers)")
    for column in ("max_wrong_rate", "devices", "own labels", "pooled labels",
                   "own: threshold", "own: hit rate", "own: wrong", "own: devices over",
                   "pooled: threshold", "pooled: hit rate", "pooled: wrong",
                   "pooled: devices over"):
        table.add_column(column)
    for rate in args.rates:
        for devices in args.devices:
            r = held_out(scores, wrong, devices, rate, prior, args.seed)
            own_labels = len(scores) // devices // 2

            def over(key: str, rate: float = rate, r: dict = r) -> str:
                return f"{sum(w > rate for w in r[key])}/{len(r[key])}"
            table.add_row(f"{rate:.0%}", str(devices), str(own_labels),
                          f"{np.median(r['pool_labels']):.0f}",
                          f"{np.median(r['own_t']):.3f}", f"{np.median(r['own_hit']):.1%}",
                          f"{np.median(r['own_wrong']):.1%}", over("own_wrong"),
                          f"{np.median(r['pool_t']):.3f}", f"{np.median(r['pool_hit']):.1%}",
                          f"{np.median(r['pool_wrong']):.1%}", over("pool_wrong"))
    print_table(table)


if __name__ == "__main__":
    main()
