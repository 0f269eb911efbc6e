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

Two judges, a table each. The **verifier's probability** of its most probable candidate
(the judge before the learned decision; its rows as above). And the **learned decision's
score** (shared.verifier.decision, the product's default judge), as the matcher computes
it (client.matching.matcher ``_decided``): of the five candidates (picked by MiniLM, as
above), those whose cosine by the card's encoder (MPNet, ``decision.encoder``) reaches the
recall tau (MPNet's tau less the recall margin) count, most similar first, at most
``VERIFIED_AT_MOST``; the pick is the most probable of them; the features are their MPNet
cosines and the verifier's probabilities (decision_study ``record`` and ``Study``, the
fit's own code), with the verifier card's threshold; the very same question is served by
identity (no label), a pick the card's kept parts refuse (``keeps``: the rules kept beside
it) is never served nor labelled, as the card's own evidence counts picks. Its rows:

- **static**: the shipped verifier and card, served where the score reaches the card's
  first threshold (where a new device's bound starts on the card's evidence alone,
  ``_common.first_threshold``, at each rate), no bound, no exploration;
- **before**: the shipped verifier and card; each device's bound as client.learning.state
  ``Learned`` chooses it (run here on a scratch store), its first half's labels tested
  with the card's evidence, exploring as the device explores the decision's score
  (``Exploration.for_judge``, until its own labels settle the threshold: ``settled``);
  beside it, the same labels alone with the card's first threshold as the prior (no
  evidence: what the rows after the rounds do, on the shipped verifier);
- **after**: the final global verifier with the card's coefficients (the card fitted on
  the shipped verifier); the bound on the device's first half's labels scored by this
  judge alone, with no evidence of its own, the prior the card's first threshold at the
  rate (what the card's evidence backs for the shipped verifier: 0.926 at 2%, the default
  rate); at another rate also with 0.926 as the prior, where the two differ.

Hit rate: the share of test questions answered from the cache; wrong: the share of
served answers that are wrong (which the bound holds at ``max_wrong_rate``); at most
about half the questions can be served right (half the originals are stored). With
SecAgg+ on, one run for each upload cap (``--secure-upload-mb``; 0 sends every entry):
what the cap's compression costs in hit rate.

With ``--traffic sts`` (and ``--sts FOLDER``), the traffic is declarative sentences with
human paraphrases instead, the STS benchmark's pairs of one meaning (``_sts``: scored 4 or
more, free-text genres): each pair's second sentence asked of a cache holding half of the
first sentences, candidates and right answers as above (pooled_bound.cache_traffic); the
federation's traffic from sts-train, the held-out devices' from sts-dev and sts-test, no
sentence in both; a pair sharing a sentence with an earlier pair of its part, or whose
first sentence is nearly identical to an earlier one's (``--distinct``), left out. Each
part is as large as the data allows unless --federation / --held-out ask for fewer, and
the federation has a device for each --pairs-per-client of its pairs (as for Arena).

    python benchmarks/fl_held_out.py                       # SecAgg+ off, on, on capped
    python benchmarks/fl_held_out.py --quick
    python benchmarks/fl_held_out.py --traffic sts --sts stsbenchmark/ --secure off
"""

import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (
    base_parser,
    distinct_requests,
    embed_cached,
    first_threshold,
    load_encoder,
    note,
    pct,
    print_table,
    unique,
)
from _sts import FILES as STS_FILES
from _sts import labelled as sts_labelled
from _sts import read_sts
from decision_study import Asked, Study, record, scores_of_x
from meancache.client.cache.store import EntryStore
from meancache.client.config import Settings
from meancache.client.learning.bound import Bound, Judge, Label, Rows, choose, choose_pooled
from meancache.client.learning.explore import Exploration
from meancache.client.learning.state import Learned
from meancache.client.matching.settings import RECALL_MARGIN
from meancache.client.verifier import export_global_verifier
from meancache.fl_server.rounds import HISTORY
from meancache.fl_server.simulate import SimulationConfig, simulate
from meancache.shared.encoder import profile_threshold
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.fl.checkpoint import latest_checkpoint, read_meta
from meancache.shared.pairs import Pair
from meancache.shared.query import embedding_text
from meancache.shared.verifier.decision import DECISION_JUDGE, KEEPS, LearnedDecision
from meancache.shared.verifier.runtime import LearnedVerifier
from pooled_bound import Traffic, arena_questions, arena_traffic, cache_traffic, judged
from rich.table import Table

SPLIT_SEED = 0  # which held-out questions are a device's, and which half it learned
STS_FEDERATION, STS_HELD_OUT = ("sts-train.csv",), ("sts-dev.csv", "sts-test.csv")


def sts_paraphrases(folder: Path, files: tuple[str, ...]) -> list[Pair]:
    """The pairs of one meaning (``_sts.labelled``'s label 1) of the STS benchmark's
    ``files`` alone: ``_sts.read_sts`` run on a scratch folder holding those files (linked)
    and the others empty."""
    with tempfile.TemporaryDirectory(prefix="meancache-fl-held-out-sts-") as tmp:
        for name in STS_FILES:
            if name in files:
                if not (folder / name).is_file():
                    raise SystemExit(f"{folder} lacks {name}")
                (Path(tmp) / name).symlink_to((folder / name).resolve())
            else:
                (Path(tmp) / name).touch()
        return [p for p in sts_labelled(read_sts(Path(tmp))) if p.label == 1]


def sts_parts(folder: Path, rng: random.Random, encoder, cache_dir: Path, distinct: float
              ) -> tuple[list[Pair], list[Pair]]:
    """The federation's pairs (sts-train) and the held-out devices' (sts-dev, sts-test),
    each in ``rng``'s order: a pair sharing a sentence with an earlier one of its part or
    with any of the other part left out, and one whose first sentence is nearly identical
    to an earlier kept one's (``distinct_requests`` at ``distinct``)."""
    federation, held = (sts_paraphrases(folder, files) for files in (STS_FEDERATION,
                                                                      STS_HELD_OUT))
    train_sentences = {s for p in federation for s in (p.q1, p.q2)}
    parts = []
    for name, pairs in (("federation (sts-train)", federation),
                        ("held-out (sts-dev + sts-test)", held)):
        rng.shuffle(pairs)
        seen: set[str] = set()
        kept = []
        crossing = 0
        for p in pairs:
            if pairs is held and {p.q1, p.q2} & train_sentences:
                crossing += 1
                continue
            if {p.q1, p.q2} & seen:
                continue
            seen |= {p.q1, p.q2}
            kept.append(p)
        firsts = set(distinct_requests([p.q1 for p in kept], encoder, cache_dir, distinct))
        distinct_pairs = [p for p in kept if p.q1 in firsts]
        note(f"STS {name}: {len(pairs)} pairs scored 4 or more, {crossing} sharing a "
             f"sentence with sts-train, {len(pairs) - crossing - len(kept)} sharing one with "
             f"an earlier pair, {len(kept) - len(distinct_pairs)} with a first sentence "
             f"nearly identical to an earlier one's: {len(distinct_pairs)} kept")
        parts.append(distinct_pairs)
    return parts[0], parts[1]


class Remembered:
    """A verifier whose probabilities are kept: it scores each pair alone
    (``LearnedVerifier.pair_probabilities``), so the decision's counting candidates read
    the very numbers the verifier's rows read, scored once."""

    def __init__(self, verifier: LearnedVerifier) -> None:
        self.verifier, self.threshold = verifier, verifier.threshold
        self._kept: dict[tuple[str, str], float] = {}

    def probabilities(self, query: str, candidates: list[str]) -> np.ndarray:
        missing = [c for c in dict.fromkeys(candidates) if (query, c) not in self._kept]
        if missing:
            for c, p in zip(missing, self.verifier.probabilities(query, missing), strict=True):
                self._kept[(query, c)] = float(p)
        return np.array([self._kept[(query, c)] for c in candidates])


@dataclass(frozen=True)
class Judged:
    """A judge's view of each question: its score of the pick, whether serving the pick
    is wrong, whether the pick is served by the score (else never served nor labelled: no
    candidate counts, or the card's kept parts refuse it), and whether it is served by
    identity (the very same question: always, never labelled)."""

    scores: np.ndarray
    wrong: np.ndarray
    scored: np.ndarray
    identity: np.ndarray

    @classmethod
    def every(cls, scores: np.ndarray, wrong: np.ndarray) -> "Judged":
        """Every question's pick scored, none served by identity (the verifier's rows)."""
        return cls(scores, wrong, np.ones(len(scores), bool), np.zeros(len(scores), bool))

    def serves(self, i: int, threshold: float) -> bool:
        return bool(self.identity[i] or (self.scored[i] and self.scores[i] >= threshold))


def decided(verifier: "LearnedVerifier | Remembered", traffic: Traffic, encoder,
            cache_dir: Path, decision: LearnedDecision) -> Judged:
    """The learned decision's score of each question's pick over ``verifier``'s
    probabilities (the module's docstring): the counting candidates by ``encoder``'s
    (the card's MPNet) cosines, the features and their flags as decision_study computes
    them for its groups."""
    if encoder.model_version != decision.encoder_version:
        raise SystemExit(f"the card was fitted on {decision.encoder} "
                         f"{decision.encoder_version}, not on {encoder.model_version}")
    tau = profile_threshold("mpnet")
    recall_tau = tau - RECALL_MARGIN
    texts = unique(c for row in traffic.candidates for c in row)
    at = {t: k for k, t in enumerate(texts)}
    stored = embed_cached(encoder, [embedding_text(t) for t in texts], cache_dir)
    asked = embed_cached(encoder, [embedding_text(q) for q in traffic.asked], cache_dir)
    records = []
    for i, (query, candidates, right) in enumerate(zip(
            traffic.asked, traffic.candidates, traffic.right, strict=True)):
        cosines = stored[[at[c] for c in candidates]] @ asked[i]
        order = np.argsort(-cosines, kind="stable")  # most similar first, as the matcher
        records.append({"domain": "arena", "split": "test", "group": str(i),
                        **record(Asked(query, str(i), candidates, right), cosines, order,
                                 recall_tau, verifier, None)})  # type: ignore[arg-type]
    study = Study(records, tau, recall_tau, verifier.threshold)
    scores = scores_of_x(study.x, decision.coefficients, decision.intercept)
    system = "learned" + "".join(f" + {k}" for k in KEEPS if k in decision.keeps)
    let_through, _, _ = study.served(system, scores, -np.inf)
    scored = let_through & study.scored & ~study.same
    note(f"the learned decision: {int(study.scored.sum() + study.same.sum())} of "
         f"{len(records)} questions with a candidate counting at the recall tau "
         f"{recall_tau:.3f}, {int(study.same.sum())} of them the very same question, "
         f"{int((study.scored & ~study.same & ~let_through).sum())} picks refused by the "
         f"card's kept parts ({', '.join(sorted(decision.keeps)) or 'none'})")
    return Judged(np.where(scored, scores, np.nan), ~study.pick_right, scored, study.same)


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


def static(judge: Judged, devices: int, threshold: float) -> dict[str, float | None]:
    """A fixed threshold alone: no bound, no exploration (the held-out devices' second
    halves, as ``held_out`` measures them)."""
    test = np.concatenate([test for _, test in device_halves(len(judge.scores), devices)])
    hits = np.array([i for i in test if judge.serves(i, threshold)], dtype=int)
    return {"threshold": threshold, "learned": 0, "settled": 0, "served": len(hits),
            "bad": int(judge.wrong[hits].sum()), "hit": len(hits) / len(test),
            "wrong": float(judge.wrong[hits].mean()) if len(hits) else None}


# A device's bound on its own labels at a rate, and whether its labels settle it (the
# exploration eases); None: no such row at that rate.
Device = Callable[[list[Label], float], "tuple[Bound, bool] | None"]


def verifier_bound(prior: float, pool: BoundEvidence | None) -> Device:
    """The bound on the verifier's probability: the labels alone (``choose``) or with
    ``pool`` (``choose_pooled``), from ``prior``; settled where the labels chose it."""
    pooled = None if pool is None else Rows.pooled_bins(*pool.rows())

    def bound(own: list[Label], rate: float) -> tuple[Bound, bool]:
        chosen = choose(own, rate, prior) if pooled is None else \
            choose_pooled(own, own, pooled, rate, prior)
        return chosen, chosen.learned

    return bound


def device_bound(judge_at: Callable[[float], Judge | None]) -> Device:
    """The bound a device's ``Learned`` (client.learning.state) chooses on its labels,
    scored by ``judge_at(rate)`` (its name, prior and evidence: ``Learned.use``), and
    whether they settle it (``Learned.settled``): run on a scratch store."""

    def bound(own: list[Label], rate: float) -> tuple[Bound, bool] | None:
        judge = judge_at(rate)
        if judge is None:
            return None
        with tempfile.TemporaryDirectory(prefix="meancache-fl-held-out-") as tmp:
            store = EntryStore(Path(tmp))
            try:
                learned = Learned(store, rate)
                learned.use(judge)
                for label in own:
                    learned.learn(label)
                chosen = learned.bound
                return chosen, learned.settled(chosen.threshold)
            finally:
                store.close()

    return bound


def held_out(judge: Judged, devices: int, rate: float, device: Device,
             exploration: Exploration, seed: int) -> dict[str, float | None] | None:
    """Over ``devices`` held-out devices (``device_halves``): thresholds chosen by each
    one's first half (``device``), applied to its second as a device does with
    ``exploration`` (client.learning.explore: until its labels settle the threshold every
    would-be hit within the exploring width above it is asked upstream, not served;
    afterwards its rate of them). None where ``device`` has no row at ``rate``."""
    draws = random.Random(seed)
    asked = served = bad = learned = settled = 0
    thresholds = []
    for first, test in device_halves(len(judge.scores), devices):
        own = [Label(float(judge.scores[i]), bool(judge.wrong[i])) for i in first
               if judge.scored[i]]
        chosen = device(own, rate)
        if chosen is None:
            return None
        bound, settles = chosen
        hits = [i for i in test if judge.identity[i] or (
            judge.scored[i] and judge.scores[i] >= bound.threshold
            and not exploration.explores(float(judge.scores[i]), bound.threshold, draws,
                                         settles))]
        asked, served = asked + len(test), served + len(hits)
        bad += int(judge.wrong[hits].sum())
        learned += int(bound.learned)
        settled += int(settles)
        thresholds.append(min(bound.threshold, 1.0))
    return {"threshold": float(np.median(thresholds)), "learned": learned,
            "settled": settled, "served": served, "bad": bad, "hit": served / asked,
            "wrong": bad / served if served else None}


@dataclass(frozen=True)
class Measured:
    """A row of the report: a judge's view of the held-out traffic, the devices' bound
    on it and their exploration."""

    judged: Judged
    device: Device
    exploration: Exploration


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
    parser.add_argument("--traffic", choices=["arena", "sts"], default="arena",
                        help="paraphrased Arena requests, or the STS benchmark's human "
                        "paraphrases of declarative sentences (needs --sts)")
    parser.add_argument("--sts", type=Path, help="the STS benchmark's csv folder the sts "
                        "traffic is made of (benchmarks/_sts.py)")
    parser.add_argument("--federation", type=int,
                        help="questions of the federation's traffic (Arena: 2300; STS: "
                        "every sts-train pair kept)")
    parser.add_argument("--held-out", type=int,
                        help="questions of the held-out devices' traffic (Arena: 1000; STS: "
                        "every sts-dev and sts-test pair kept)")
    parser.add_argument("--devices", type=int, default=5, help="held-out devices")
    parser.add_argument("--clients", type=int, help="devices in the federation (Arena: 23; "
                        "STS: one for each --pairs-per-client of its traffic)")
    parser.add_argument("--per-round", type=int,
                        help="devices a round (10, or every device where fewer)")
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--pairs-per-client", type=int, default=100)
    parser.add_argument("--verifier-layers", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--learning-rate", type=float, default=5e-5)
    parser.add_argument("--rates", type=float, nargs="+", default=[0.02, 0.05])
    parser.add_argument("--reuse", action="store_true",
                        help="measure the rounds an earlier run of the same --cache-dir and "
                        "--seed left (its checkpoints), not new ones")
    parser.add_argument("--explore-until-learned", choices=("true", "false"),
                        default="true", help="the held-out devices explore every near "
                        "would-be hit until their labels settle the threshold "
                        "(explore_until_learned; false: the judge's rate of them)")
    parser.add_argument("--secure", choices=["off", "on", "both"], default="both",
                        help="SecAgg+ in the rounds")
    parser.add_argument("--secure-upload-mb", type=float, nargs="+", default=[0.0, 4.5],
                        help="with SecAgg+, one run for each cap on a device's masked "
                        "weights a round (run config secure-upload-mb; 0: every entry)")
    args = parser.parse_args()
    if args.traffic == "sts" and args.sts is None:
        parser.error("--traffic sts needs --sts FOLDER")
    if args.quick:
        args.federation, args.held_out, args.devices = 400, 200, 2
        args.clients, args.per_round, args.rounds, args.pairs_per_client = 2, 2, 1, 100
    out = args.cache_dir / "fl_held_out" / (
        f"seed{args.seed}" if args.traffic == "arena" else f"sts-seed{args.seed}")
    rng = random.Random(args.seed)
    encoder = load_encoder("onnx", args.cache_dir)
    if args.traffic == "arena":
        args.federation = 2300 if args.federation is None else args.federation
        args.held_out = 1000 if args.held_out is None else args.held_out
        args.clients = 23 if args.clients is None else args.clients
        questions = distinct_requests(arena_questions(args.data_dir, rng), encoder,
                                      args.cache_dir, args.distinct)
        if len(questions) < args.federation + args.held_out:
            raise SystemExit(f"only {len(questions)} Arena questions for --federation plus "
                             "--held-out")
        federation = arena_traffic(questions[: args.federation], rng, encoder,
                                   args.cache_dir)
        held = arena_traffic(questions[args.federation: args.federation + args.held_out],
                             rng, encoder, args.cache_dir)
    else:
        fed_pairs, held_pairs = sts_parts(args.sts, rng, encoder, args.cache_dir,
                                          args.distinct)
        args.federation = min(len(fed_pairs), args.federation or len(fed_pairs))
        args.held_out = min(len(held_pairs), args.held_out or len(held_pairs))
        fed_pairs, held_pairs = fed_pairs[: args.federation], held_pairs[: args.held_out]
        if args.clients is None:
            args.clients = max(2, args.federation // args.pairs_per_client)
        federation = cache_traffic([p.q2 for p in fed_pairs], [p.q1 for p in fed_pairs],
                                   rng, encoder, args.cache_dir)
        held = cache_traffic([p.q2 for p in held_pairs], [p.q1 for p in held_pairs], rng,
                             encoder, args.cache_dir)
    if args.per_round is None:
        args.per_round = min(10, args.clients)
    note(f"{args.traffic} traffic: the federation's {len(federation.asked)} questions "
         f"({sum(r is not None for r in federation.right)} with their own among the "
         "candidates), "
         f"{args.clients} devices, {args.per_round} a round; the held-out devices' "
         f"{len(held.asked)} ({sum(r is not None for r in held.right)} with theirs)")
    shipped = LearnedVerifier.load()
    pairs = pairs_file(out / "federation.jsonl", federation, shipped)
    decision = LearnedDecision.load()
    mpnet = load_encoder("onnx-int8", args.cache_dir, model=decision.encoder)
    firsts = {rate: first_threshold(decision, rate) for rate in args.rates}
    first = first_threshold(decision)  # at the default max_wrong_rate
    note(f"the card's first threshold: {first:.3f} at the default rate; "
         + ", ".join(f"{t:.3f} at {rate:.0%}" for rate, t in firsts.items()))
    until_learned = args.explore_until_learned == "true"
    plain = Exploration(until_learned=until_learned)
    explore = Exploration.for_judge(decision.judge, until_learned=until_learned)
    verifier_rows: dict[str, Measured] = {}
    decision_rows: dict[str, Measured] = {}
    note(f"judging the held-out devices' {len(held.asked)} questions' candidates")
    remembered = Remembered(shipped)
    scores, wrong, _ = judged(remembered, held)  # type: ignore[arg-type]
    verifier_rows["before: shipped verifier, own labels"] = Measured(
        Judged.every(scores, wrong), verifier_bound(shipped.threshold, None), plain)
    static_verifier = static(Judged.every(scores, wrong), args.devices, shipped.threshold)
    card = decided(remembered, held, mpnet, args.cache_dir, decision)
    decision_rows["before: shipped verifier + card, own labels + the card's evidence"] = \
        Measured(card, device_bound(lambda rate: Judge(decision.judge, decision.threshold,
                                                       decision.evidence)), explore)
    decision_rows["before: shipped verifier + card, own labels alone, prior the card's "
                  "first threshold"] = Measured(card, device_bound(
                      lambda rate: Judge(decision.judge, firsts[rate])), explore)
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
        remembered = Remembered(verifier)
        scores, wrong, _ = judged(remembered, held)  # type: ignore[arg-type]
        note(f"{name}: pool of {pool.labels} labels, judge {pool.judge[:16] or '(none)'}")
        every = Judged.every(scores, wrong)
        verifier_rows[f"{name}: global verifier, own labels"] = Measured(
            every, verifier_bound(verifier.threshold, None), plain)
        verifier_rows[f"{name}: global verifier, own + pooled labels"] = Measured(
            every, verifier_bound(verifier.threshold, pool), plain)
        over_global = decided(remembered, held, mpnet, args.cache_dir, decision)
        judge = f"{DECISION_JUDGE} {decision.sha256} over {verifier.card.sha256}"
        decision_rows[f"{name}: global verifier + card, own labels alone, prior the card's "
                      "first threshold"] = Measured(over_global, device_bound(
                          lambda rate, judge=judge: Judge(judge, firsts[rate])), explore)
        decision_rows[f"{name}: global verifier + card, own labels alone, prior "
                      f"{first:.3f} (the default rate's)"] = Measured(over_global, device_bound(
                          lambda rate, judge=judge: None if firsts[rate] == first
                          else Judge(judge, first)), explore)
        trained = [r for r in rows if r.get("clients")]
        costs.append((name, time.perf_counter() - started if ran else None,
                      float(np.mean([r["seconds"] for r in rows[1:]])),
                      float(np.mean([r["bytes_per_client"] for r in trained]))
                      if trained else 0.0))
    statics = [("static: shipped verifier at its card's threshold, no bound", "-",
                static_verifier)]
    report("the verifier's probability of its pick", statics, verifier_rows, args)
    statics = [("static: shipped verifier + card at its first threshold, no bound",
                f"{rate:.0%}", static(card, args.devices, firsts[rate])) for rate in args.rates]
    report(f"the learned decision's score (card {decision.sha256[:12]}, MPNet cosines)",
           statics, decision_rows, args)
    cost = Table(title="cost of the rounds (this machine)")
    for column in ("run", "whole run, s", "per round, s", "sent per device per round, KiB"):
        cost.add_column(column)
    for name, seconds, per_round, sent in costs:
        cost.add_row(name, "-" if seconds is None else f"{seconds:.0f}", f"{per_round:.0f}",
                     f"{sent / 1024:.0f}")
    print_table(cost)


def report(judge: str, statics: list[tuple[str, str, dict]], rows: dict[str, Measured],
           args) -> None:
    traffic = "Arena questions" if args.traffic == "arena" else "STS sentences"
    table = Table(title=f"held-out devices at the bound, judge: {judge}; {args.devices} "
                  f"devices, {args.held_out} {traffic} (seed {args.seed}); the "
                  f"federation: {args.clients} devices, {args.per_round} a round, "
                  f"{args.rounds} rounds, {args.pairs_per_client} pairs each, the "
                  f"verifier's top {args.verifier_layers} layers")
    for column in ("decision", "max_wrong_rate", "threshold", "learned", "settled",
                   "hit rate", "served (wrong)", "wrong"):
        table.add_column(column)
    for name, rate, r in statics:
        table.add_row(name, rate, f"{r['threshold']:.3f}", "-", "-", pct(r["hit"]),
                      f"{r['served']} ({r['bad']})", pct(r["wrong"]))
    for rate in args.rates:
        for name, row in rows.items():
            r = held_out(row.judged, args.devices, rate, row.device, row.exploration,
                         args.seed)
            if r is None:
                continue
            table.add_row(name, f"{rate:.0%}", f"{r['threshold']:.3f}",
                          f"{r['learned']}/{args.devices}", f"{r['settled']}/{args.devices}",
                          pct(r["hit"]), f"{r['served']} ({r['bad']})", pct(r["wrong"]))
    print_table(table)


if __name__ == "__main__":
    main()
