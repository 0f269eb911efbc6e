"""Federated rounds measured where they should help: held-out devices' hit rate at the
error bound before and after the rounds, with SecAgg+ off and on (issue 37, part 3).

The traffic is unlike what the shipped verifier was trained on (QQP and code-made
near-misses): Chatbot Arena first turns, each asked in a code-made paraphrase
(learning_stream.paraphrase) of a cache holding half of the originals, the verifier
choosing among the five stored questions nearest by MiniLM's cosine
(pooled_bound.arena_traffic), after dropping each question nearly identical to an earlier
one (``--distinct``: Arena's users often send the same request, which the stream would
count as a different question, so a right answer would be scored wrong). The questions
are split in two parts that share none:

- the **federation's**: each question with the candidate the shipped verifier chooses
  and whether it is the right one, as a labelled-pairs file (a pair per question, as a
  device labels its traffic); `meancache fl simulate`'s devices train the verifier's top
  layers on their partitions of it and send their validation pairs as error-bound
  evidence, which the server pools (the encoder is not federated here, run config
  ``train-encoder = 0``, so every device keeps the same candidates);
- the **held-out devices'**: never seen by a round. Each device has learned the labels of
  the first half of its traffic and is measured on the second half, at the threshold
  its bound (client.learning.bound) chooses, exploring as a device does by default:
  before the rounds with the shipped verifier and its own labels; after them with the
  final global verifier (made int8 from the checkpoint as a device makes it,
  client.verifier.export_global_verifier), its own labels scored by it, and the pool the
  final model carries.

Hit rate: the share of test questions answered from the cache; wrong: the share of
served answers that are wrong (which the bound holds at ``max_wrong_rate``); at most
about half the questions can be served right (half the originals are stored). With
SecAgg+ on, one run for each upload cap (``--secure-upload-mb``; 0 sends every entry):
what the cap's compression costs in hit rate.

    python benchmarks/fl_held_out.py                       # SecAgg+ off, on, on capped
    python benchmarks/fl_held_out.py --quick
"""

import json
import random
import time
from pathlib import Path

import numpy as np
from _common import (
    base_parser,
    distinct_requests,
    load_encoder,
    note,
    pct,
    print_table,
)
from meancache.client.config import Settings
from meancache.client.learning.bound import Label, Rows, choose, choose_pooled
from meancache.client.learning.explore import Exploration
from meancache.client.verifier import export_global_verifier
from meancache.fl_server.rounds import HISTORY
from meancache.fl_server.simulate import SimulationConfig, simulate
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.fl.checkpoint import latest_checkpoint, read_meta
from meancache.shared.verifier.runtime import LearnedVerifier
from pooled_bound import Traffic, arena_questions, arena_traffic, judged
from rich.table import Table

SPLIT_SEED = 0  # which held-out questions are a device's, and which half it learned


def pairs_file(path: Path, traffic: Traffic, verifier: LearnedVerifier) -> Path:
    """The federation's labelled pairs: each question with the candidate ``verifier``
    chooses, labelled 1 where it is the question's own original."""
    note(f"judging the federation's {len(traffic.asked)} questions' candidates")
    _, wrong, chosen = judged(verifier, traffic)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as out:
        for asked, candidate, bad in zip(traffic.asked, chosen, wrong, strict=True):
            out.write(json.dumps({"q1": asked, "q2": candidate, "label": int(not bad),
                                  "split": "train"}) + "\n")
    note(f"{len(chosen)} federation pairs ({1 - wrong.mean():.1%} labelled the same) in {path}")
    return path


def device_halves(questions: int, devices: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The held-out traffic split among ``devices`` in a seeded order: each device's first
    half (whose labels it learned) and second half (on which it is measured)."""
    order = np.array(random.Random(SPLIT_SEED).sample(range(questions), questions))
    return [(shard[: len(shard) // 2], shard[len(shard) // 2:])
            for shard in np.array_split(order, devices)]


def static(scores: np.ndarray, wrong: np.ndarray, devices: int, threshold: float
           ) -> dict[str, float | None]:
    """The verifier's card threshold alone: no bound, no exploration (the held-out
    devices' second halves, as ``held_out`` measures them)."""
    test = np.concatenate([test for _, test in device_halves(len(scores), devices)])
    hits = test[scores[test] >= threshold]
    return {"threshold": threshold, "learned": 0, "hit": len(hits) / len(test),
            "wrong": float(wrong[hits].mean()) if len(hits) else None}


def held_out(scores: np.ndarray, wrong: np.ndarray, devices: int, rate: float, prior: float,
             pool: BoundEvidence | None, seed: int) -> dict[str, float | None]:
    """Over ``devices`` held-out devices (``device_halves``): thresholds chosen by each
    one's first half (with ``pool`` where given), applied to its second as a device does
    with the default exploration (client.learning.explore: until its labels choose the
    threshold every would-be hit within the exploring width above it is asked upstream,
    not served; afterwards a tenth of them)."""
    explore, draws = Exploration(), random.Random(seed)
    pooled = None if pool is None else Rows.pooled_bins(*pool.rows())
    asked = served = bad = learned = 0
    thresholds = []
    for first, test in device_halves(len(scores), devices):
        own = [Label(float(scores[i]), bool(wrong[i])) for i in first]
        bound = choose(own, rate, prior) if pooled is None else \
            choose_pooled(own, own, pooled, rate, prior)
        hits = [i for i in test if scores[i] >= bound.threshold and not explore.explores(
            float(scores[i]), bound.threshold, draws, bound.learned)]
        asked, served = asked + len(test), served + len(hits)
        bad += int(wrong[hits].sum())
        learned += int(bound.learned)
        thresholds.append(min(bound.threshold, 1.0))
    return {"threshold": float(np.median(thresholds)), "learned": learned,
            "hit": served / asked, "wrong": bad / served if served else None}


ROUNDS = 6


def run_name(secure: bool, upload_mb: float, rounds: int) -> str:
    """The run's directory under the cache (the first runs', at ``ROUNDS`` rounds and with
    every entry, keep their names)."""
    name = "plain" if not secure else "secure" if upload_mb == 0 else f"secure-{upload_mb:g}mb"
    return name if rounds == ROUNDS else f"{name}-{rounds}rounds"


def federate(pairs: Path, out: Path, args, secure: bool, upload_mb: float
             ) -> tuple[Path, list[dict], bool]:
    """`fl simulate` over ``pairs``; the final checkpoint, the rounds' rows, and whether
    they were run now (not reused)."""
    checkpoints = out / run_name(secure, upload_mb, args.rounds)
    final = latest_checkpoint(checkpoints) if args.reuse else None
    if final is not None:
        note(f"reusing the rounds in {checkpoints}")
        history = (checkpoints / HISTORY).read_text().splitlines()
        return final, [json.loads(line) for line in history], False
    config = SimulationConfig(
        pairs=pairs, checkpoint_dir=checkpoints, clients=args.clients,
        per_round=args.per_round, run_config={
            "num-server-rounds": args.rounds, "pairs-per-client": args.pairs_per_client,
            "train-encoder": 0, "verifier-top-layers": args.verifier_layers,
            "epochs": args.epochs, "learning-rate": args.learning_rate,
            "secure-aggregation": int(secure), "secure-upload-mb": upload_mb,
            "held-out-pairs": 0, "seed": args.seed})
    note(f"fl simulate: {args.clients} devices, {args.per_round} a round, {args.rounds} "
         f"rounds, SecAgg+ {'on' if secure else 'off'} (Flower's log: {out / 'flwr'})")
    rows = simulate(config, out / "flwr", on_round=lambda row: note(
        f"  round {int(row['round'])} done at {row['seconds']:.0f} s"))
    final = latest_checkpoint(checkpoints)
    if final is None:
        raise SystemExit(f"the simulation left no global model in {checkpoints}")
    return final, rows, True


def global_verifier(checkpoint: Path, work: Path) -> tuple[LearnedVerifier, BoundEvidence]:
    """The int8 verifier a device makes from ``checkpoint``, and the pool it carries for
    that verifier (empty where it names another judge)."""
    settings = Settings(data_dir=work / "device")
    made = export_global_verifier(settings, checkpoint)
    if made is None:
        raise SystemExit(f"{checkpoint} holds no verifier")
    meta = read_meta(checkpoint)
    pool = BoundEvidence.from_record(meta.bound)
    verifier = LearnedVerifier.load(made)
    if pool.judge != verifier.card.judge:  # a cache applies only its own judge's pool
        note(f"the pool names {pool.judge[:16] or 'no judge'}, not the global verifier "
             f"{verifier.card.judge[:16]}: a device would not apply it")
        pool = BoundEvidence.empty()
    return verifier, pool


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--distinct", type=float, default=0.9,
                        help="drop an Arena question whose MiniLM cosine to an earlier one "
                        "reaches this (the same request from two users; 1: keep all)")
    parser.add_argument("--federation", type=int, default=2300,
                        help="questions of the federation's traffic")
    parser.add_argument("--held-out", type=int, default=1000,
                        help="questions of the held-out devices' traffic")
    parser.add_argument("--devices", type=int, default=5, help="held-out devices")
    parser.add_argument("--clients", type=int, default=23, help="devices in the federation")
    parser.add_argument("--per-round", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--pairs-per-client", type=int, default=100)
    parser.add_argument("--verifier-layers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.02, 0.05])
    parser.add_argument("--reuse", action="store_true",
                        help="measure the rounds an earlier run of the same --cache-dir and "
                        "--seed left (its checkpoints), not new ones")
    parser.add_argument("--secure", choices=["off", "on", "both"], default="both",
                        help="SecAgg+ in the rounds")
    parser.add_argument("--secure-upload-mb", type=float, nargs="+", default=[0.0, 4.5],
                        help="with SecAgg+, one run for each cap on a device's masked "
                        "weights a round (run config secure-upload-mb; 0: every entry)")
    args = parser.parse_args()
    if args.quick:
        args.federation, args.held_out, args.devices = 400, 200, 2
        args.clients, args.per_round, args.rounds, args.pairs_per_client = 2, 2, 1, 100
    out = args.cache_dir / "fl_held_out" / f"seed{args.seed}"
    rng = random.Random(args.seed)
    encoder = load_encoder("onnx", args.cache_dir)
    questions = distinct_requests(arena_questions(args.data_dir, rng), encoder,
                                  args.cache_dir, args.distinct)
    if len(questions) < args.federation + args.held_out:
        raise SystemExit(f"only {len(questions)} Arena questions for --federation plus "
                         "--held-out")
    federation = arena_traffic(questions[: args.federation], rng, encoder, args.cache_dir)
    held = arena_traffic(questions[args.federation: args.federation + args.held_out], rng,
                         encoder, args.cache_dir)
    shipped = LearnedVerifier.load()
    pairs = pairs_file(out / "federation.jsonl", federation, shipped)
    results: dict[str, tuple[np.ndarray, np.ndarray, float, BoundEvidence | None]] = {}
    note(f"judging the held-out devices' {len(held.asked)} questions' candidates")
    scores, wrong, _ = judged(shipped, held)
    results["before: shipped verifier, own labels"] = (scores, wrong, shipped.threshold, None)
    caps = args.secure_upload_mb
    runs = {"off": [(False, 0.0)], "on": [(True, mb) for mb in caps],
            "both": [(False, 0.0)] + [(True, mb) for mb in caps]}[args.secure]
    costs = []
    for secure, upload_mb in runs:
        started = time.perf_counter()
        final, rows, ran = federate(pairs, out, args, secure, upload_mb)
        verifier, pool = global_verifier(final, out / run_name(secure, upload_mb, args.rounds))
        name = "after, SecAgg+ " + ("off" if not secure else "on" if upload_mb == 0
                                    else f"on, {upload_mb:g} MB cap")
        scores, wrong, _ = judged(verifier, held)
        note(f"{name}: pool of {pool.labels} labels, judge {pool.judge[:16] or '(none)'}")
        results[f"{name}: global verifier, own labels"] = (scores, wrong, verifier.threshold,
                                                          None)
        results[f"{name}: global verifier, own + pooled labels"] = (
            scores, wrong, verifier.threshold, pool)
        trained = [r for r in rows if r.get("clients")]
        costs.append((name, time.perf_counter() - started if ran else None,
                      float(np.mean([r["seconds"] for r in rows[1:]])),
                      float(np.mean([r["bytes_per_client"] for r in trained]))
                      if trained else 0.0))
    report(results, args)
    cost = Table(title="cost of the rounds (this machine)")
    for column in ("run", "whole run, s", "per round, s", "sent per device per round, KiB"):
        cost.add_column(column)
    for name, seconds, per_round, sent in costs:
        cost.add_row(name, "-" if seconds is None else f"{seconds:.0f}", f"{per_round:.0f}",
                     f"{sent / 1024:.0f}")
    print_table(cost)


def report(results, args) -> None:
    table = Table(title=f"held-out devices at the bound: {args.devices} devices, "
                  f"{args.held_out} Arena questions (seed {args.seed}); the federation: "
                  f"{args.clients} devices, {args.per_round} a round, {args.rounds} rounds, "
                  f"{args.pairs_per_client} pairs each, the verifier's top "
                  f"{args.verifier_layers} layers")
    for column in ("decision", "max_wrong_rate", "threshold", "learned", "hit rate",
                   "wrong"):
        table.add_column(column)
    before = results["before: shipped verifier, own labels"]
    r = static(before[0], before[1], args.devices, before[2])
    table.add_row("static: shipped verifier at its card's threshold, no bound", "-",
                  f"{r['threshold']:.3f}", "-", pct(r["hit"]), pct(r["wrong"]))
    for rate in args.rates:
        for name, (scores, wrong, prior, pool) in results.items():
            r = held_out(scores, wrong, args.devices, rate, prior, pool, args.seed)
            table.add_row(name, f"{rate:.0%}", f"{r['threshold']:.3f}",
                          f"{r['learned']}/{args.devices}", pct(r["hit"]), pct(r["wrong"]))
    print_table(table)


if __name__ == "__main__":
    main()
