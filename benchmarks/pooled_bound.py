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

It reports, over the held-out devices, the median threshold, and over their test traffic
together the hit rate (the share of test questions answered from the cache) and the wrong
rate (the share of served answers that are wrong, which the bound holds at
``max_wrong_rate``); and how many devices' thresholds their labels chose (else the
verifier card's prior, or nothing served where they show its region too wrong). The
judged labels are kept in --cache-dir under the verifier's version, so a rerun with the
same verifier scores nothing again. Pair-level: every pair is labelled (labelled_with 1),
as the misses a device compares and the hits it explores are.

    python benchmarks/pooled_bound.py                    # 4,000 labels a stream, 5 and 20 devices
    python benchmarks/pooled_bound.py --quick
"""

import json
import random
from dataclasses import dataclass

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


@dataclass(frozen=True)
class Traffic:
    """Questions asked of a cache: each one's nearest stored questions (its candidates)
    and which of them, if any, is the question it paraphrases (its right answer)."""

    asked: list[str]
    candidates: list[list[str]]
    right: list[int | None]  # index into the question's candidates, None: not stored


def arena_questions(data_dir, rng: random.Random) -> list[str]:
    """Chatbot Arena first turns of 3 to 40 words, distinct, in ``rng``'s order."""
    rows = [json.loads(line)["text"] for line in
            (data_dir / "instructions" / "arena_first_turns.jsonl").open()]
    rows = list(dict.fromkeys(r for r in rows if 3 <= len(r.split()) <= 40))
    rng.shuffle(rows)
    return rows


def arena_traffic(originals: list[str], rng: random.Random, encoder, cache_dir,
                  nearest: int = 5) -> Traffic:
    """Each original asked in a code-made paraphrase (learning_stream.paraphrase) of a
    cache holding half of the originals; its candidates are the ``nearest`` stored
    questions by the encoder's cosine."""
    return cache_traffic([paraphrase(r, rng) for r in originals], originals, rng, encoder,
                         cache_dir, nearest)


def cache_traffic(asked: list[str], originals: list[str], rng: random.Random, encoder,
                  cache_dir, nearest: int = 5) -> Traffic:
    """Each of ``asked`` (the question paraphrasing ``originals``' same-index one) asked of
    a cache holding half of the originals, drawn by ``rng``; its candidates are the
    ``nearest`` stored ones by the encoder's cosine, its right answer its own original
    where stored."""
    stored = sorted(rng.sample(range(len(originals)), len(originals) // 2))
    kept = embed_cached(encoder, [originals[i] for i in stored], cache_dir)
    queries = embed_cached(encoder, asked, cache_dir)
    order = np.argsort(-(queries @ kept.T), axis=1)[:, :nearest]
    candidates = [[originals[stored[c]] for c in row] for row in order]
    right = [next((k for k, c in enumerate(row) if stored[c] == i), None)
             for i, row in enumerate(order)]
    return Traffic(asked, candidates, right)


def judged(verifier: LearnedVerifier, traffic: Traffic
           ) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """(the verifier's probability of its most probable candidate, whether that candidate
    is a wrong answer, the candidate) of every question."""
    scores, wrong, chosen = [], [], []
    for asked, candidates, right in zip(traffic.asked, traffic.candidates, traffic.right,
                                        strict=True):
        probabilities = verifier.probabilities(asked, candidates)
        best = int(np.argmax(probabilities))
        scores.append(float(probabilities[best]))
        wrong.append(best != right)
        chosen.append(candidates[best])
    return np.array(scores), np.array(wrong), chosen


def arena_pairs(data_dir, cache_dir, questions: int, seed: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """(verifier probability of the best candidate, wrong) of ``questions`` paraphrased
    Arena questions against a cache holding half of their originals."""
    rng = random.Random(seed)
    originals = arena_questions(data_dir, rng)[:questions]
    traffic = arena_traffic(originals, rng, load_encoder("onnx", cache_dir), cache_dir)
    note(f"judging {len(originals)} paraphrased Arena questions' five nearest stored "
         "questions")
    scores, wrong, _ = judged(LearnedVerifier.load(), traffic)
    return scores, wrong


def evidence(scores: np.ndarray, wrong: np.ndarray) -> BoundEvidence:
    return BoundEvidence.of_labels(scores, wrong.astype(float), np.ones(len(scores)))


def cached(path, make):
    """``make()``'s (scores, wrong), kept in ``path``."""
    if path.is_file():
        kept = np.load(path)
        return kept["scores"], kept["wrong"]
    scores, wrong = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, scores=scores, wrong=wrong)
    return scores, wrong


def held_out(scores: np.ndarray, wrong: np.ndarray, devices: int, rate: float, prior: float,
             seed: int) -> dict[str, list[float]]:
    order = np.array(random.Random(seed).sample(range(len(scores)), len(scores)))
    shards = np.array_split(order, devices)
    shared = [evidence(scores[s], wrong[s]) for s in shards]
    out: dict[str, list[float]] = {f"{who}_{what}": [] for who in ("own", "pool") for what
                                   in ("t", "learned", "asked", "served", "wrong")}
    out["pool_labels"] = []
    for d, shard in enumerate(shards):
        learned, test = shard[: len(shard) // 2], shard[len(shard) // 2:]
        own = [Label(float(scores[i]), bool(wrong[i])) for i in learned]
        others = [e for i, e in enumerate(shared) if i != d]
        cap = float(np.median([e.labels for e in others]))
        pool = sum((e.at_most(cap) for e in others), BoundEvidence.empty())
        alone = choose(own, rate, prior)
        pooled = choose_pooled(own, own, Rows.pooled_bins(*pool.rows()), rate, prior)
        for key, bound in (("own", alone), ("pool", pooled)):
            hits = scores[test] >= bound.threshold
            out[f"{key}_t"].append(min(bound.threshold, 1.0))
            out[f"{key}_learned"].append(bound.learned)
            out[f"{key}_asked"].append(len(test))
            out[f"{key}_served"].append(int(hits.sum()))
            out[f"{key}_wrong"].append(int(wrong[test][hits].sum()))
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
    shipped = LearnedVerifier.load()
    prior = shipped.threshold
    for stream in args.streams:
        scores, wrong = cached(  # scored by the shipped verifier: its version keys them
            args.cache_dir / "pooled_bound"
            / f"{stream}-{args.pairs}-{args.seed}-{shipped.version}.npz",
            lambda stream=stream: scored_pairs(args.data_dir, args.pairs, args.seed)
            if stream == "qqp" else arena_pairs(args.data_dir, args.cache_dir, args.pairs,
                                                args.seed))
        note(f"{stream}: prior (the verifier card's threshold) {prior:.3f}; the stream is "
             f"{wrong.mean():.1%} wrong over all labels, {wrong[scores >= prior].mean():.1%} "
             f"over the prior")
        report(stream, scores, wrong, prior, args)


def report(stream: str, scores: np.ndarray, wrong: np.ndarray, prior: float, args) -> None:
    table = Table(title=f"{stream}: held-out devices at the bound, own labels vs the pool "
                  f"({len(scores)} labels scored by the shipped verifier, seed {args.seed}; "
                  f"thresholds: median over devices; hit and wrong rates: over all held-out "
                  f"traffic, wrong = share of served answers)")
    for column in ("max_wrong_rate", "devices", "own labels", "pooled labels",
                   "own: threshold", "own: learned", "own: hit rate", "own: wrong",
                   "pooled: threshold", "pooled: learned", "pooled: hit rate",
                   "pooled: wrong"):
        table.add_column(column)
    for rate in args.rates:
        for devices in args.devices:
            r = held_out(scores, wrong, devices, rate, prior, args.seed)
            cells = []
            for who in ("own", "pool"):
                served = sum(r[f"{who}_served"])
                cells += [f"{np.median(r[f'{who}_t']):.3f}",
                          f"{sum(r[f'{who}_learned'])}/{devices}",
                          f"{served / sum(r[f'{who}_asked']):.1%}",
                          f"{sum(r[f'{who}_wrong']) / served:.1%}" if served else "-"]
            table.add_row(f"{rate:.0%}", str(devices), str(len(scores) // devices // 2),
                          f"{np.median(r['pool_labels']):.0f}", *cells)
    print_table(table)


if __name__ == "__main__":
    main()
