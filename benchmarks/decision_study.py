"""A learned decision against the hand-made one (issue 35, part 3): per asked question,
the candidates the client's decision sees, their cosines and the verifier's probabilities
(each pair alone), and which would be right to serve; a logistic model over
``shared.verifier.decision.FEATURES`` fitted on the choose splits, its threshold chosen
there for a hit precision of at least --precision, reported on the test splits.

Domains (each asked question is a cache lookup; right = its own stored question served):
- ``qqp``: the replay of QQP dev duplicates (every q1 stored, every q2 asked), choose =
  dev-a, test = dev-b (``dev_half``), as benchmarks/verification.py builds it; a stored
  question QQP links to the asked one counts as right too (the same question);
- ``arena``: Chatbot Arena first turns stored, each asked in a paraphrase made by code
  (benchmarks/learning_stream.py's ``paraphrase``); beside them code-made near-misses
  asked whose own question is not stored (every hit wrong);
- ``dense``: ShareGPT and Arena first turns, each stored beside two code-made near-misses
  of it (``shared.verifier.negatives``: negation, swapped words, numbers, names, order),
  each its own question: many near neighbours per question, where the ambiguity rule
  declines; asked as in ``arena``.
The generated domains are split into choose / test by a seeded hash of the group (a
stored question, its near-misses and its paraphrase), never by question. Beside them the
held-out near-miss set (benchmarks/data/near_miss_heldout.jsonl, one candidate a pair):
reported only, never fitted or tuned on.

Deciders: embedding only (the nearest at cosine >= tau); today's default (the pick at
p >= the card's threshold, not ``ambiguous``, the kept rules not vetoing); the learned
decision alone; and the learned decision with the ambiguity rule and with the kept rules
(the ablations). The features are computed once and kept under --work (not the repo).

    python benchmarks/decision_study.py --work /work/probe/decide35 \
        --write-card shared/verifier/decision.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (
    base_parser,
    embed_cached,
    first_threshold,
    load_encoder,
    load_qqp,
    make_table,
    note,
    pct,
    print_command,
    print_table,
    sample,
    time_each,
    unique,
)
from learning_stream import OPENERS, paraphrase
from meancache.client.matching.matcher import VERIFIED_AT_MOST, ambiguous
from meancache.client.matching.rules import WITH_LEARNED, verify
from meancache.client.matching.settings import RECALL_MARGIN
from meancache.shared.encoder import Encoder, profile_threshold
from meancache.shared.encoder.packaged import MPNET
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.pairs import Pair
from meancache.shared.query import embedding_text
from meancache.shared.verifier.decision import (
    FEATURES,
    KEEPS,
    SIGNS,
    LearnedDecision,
    card_digest,
    features,
)
from meancache.shared.verifier.negatives import EDITS
from meancache.shared.verifier.runtime import ARTEFACT_DIR, LearnedVerifier
from meancache.shared.verifier.train import dev_half
from verification import (
    NEAR_MISS,
    RULES_NEAR_MISS,
    TUNING,
    linked_groups,
    near_miss_rows,
    same_group,
)

CANDIDATES = 8  # the matcher's default ``candidates``
MARGINS = (0.2, 0.15, RECALL_MARGIN, 0.05, 0.0)  # the recall margins the ablation refits
DOMAINS = ("qqp", "arena", "dense")
HELD_OUT = "near-miss (held out)"  # reported only
# An experiment (--lone-logit), not a feature of the client's decision: the pick's logit
# once more where it is the only candidate, so that a lone pick may need the judge's word
# more than a crowded one (sign bounded >= 0 in the bounded fits).
LONE_LOGIT = "lone_logit"
# With --lone N: new sentences each stored alone, asked reworded and as a code-made
# near-miss, one candidate each; its choose split is fitted on and capped like the rules'
# tuning set (at most --near-misses of its near-misses served), its test split reported.
LONE = "lone"


# data ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Asked:
    query: str
    group: str  # what is split on
    stored: list[str]  # the cache's questions (shared per domain)
    own: int | None  # the stored question that answers it, if any


def split_of(seed: int, group: str) -> str:
    digest = hashlib.sha256(f"{seed}:{group}".encode()).digest()
    return "choose" if digest[0] < 128 else "test"


def reworded(text: str, rng: random.Random) -> str:
    """``paraphrase`` made to differ from ``text`` as the embedding reads it (a mere
    change of case would pass by identity and test nothing)."""
    out = paraphrase(text, rng)
    if embedding_text(out) == embedding_text(text):
        out = rng.choice(OPENERS) + text[0].lower() + text[1:]
    return out


def near_misses(text: str, rng: random.Random, others: list[str], count: int) -> list[str]:
    """Up to ``count`` code-made near-misses of ``text``, each of another kind of edit."""
    kinds = list(EDITS)
    rng.shuffle(kinds)
    out: list[str] = []
    for kind in kinds:
        edited = EDITS[kind](text, rng, others)
        if edited and embedding_text(edited) not in {embedding_text(t) for t in [text, *out]}:
            out.append(edited)
            if len(out) == count:
                break
    return out


def first_turns(data_dir: Path, names: tuple[str, ...]) -> list[str]:
    rows = []
    for name in names:
        with (data_dir / "instructions" / f"{name}_first_turns.jsonl").open() as fh:
            rows += [json.loads(line)["text"].strip() for line in fh]
    return unique(r for r in rows if 3 <= len(r.split()) <= 40)


def generated(data_dir: Path, names: tuple[str, ...], groups: int, stored_misses: int,
              seed: int) -> tuple[list[Asked], list[str]]:
    """Stored questions (each with ``stored_misses`` near-misses stored beside it), each
    asked in a paraphrase; a third of the groups also ask a near-miss not stored."""
    rng = random.Random(seed)
    pool = first_turns(data_dir, names)
    rng.shuffle(pool)
    stored: list[str] = []
    plan: list[tuple[str, str, bool]] = []  # (query, group, answerable)
    for text in pool[:groups]:
        misses = near_misses(text, rng, pool, stored_misses + 1)
        stored += [text, *misses[:stored_misses]]
        plan.append((reworded(text, rng), text, True))
        if len(misses) > stored_misses and rng.random() < 1 / 3:
            plan.append((misses[stored_misses], text, False))
    stored = unique(stored)
    index = {t: i for i, t in enumerate(stored)}
    return [Asked(q, g, stored, index[g] if ok else None) for q, g, ok in plan], stored


def lone_rows(data_dir: Path, groups: int, seed: int, used: set[str]) -> list[dict]:
    """First turns no other domain stores, each stored alone and asked twice: reworded
    (the same question) and as one code-made near-miss (not); ``group`` is the stored
    sentence, so both land in the same split."""
    rng = random.Random(seed)
    pool = [t for t in first_turns(data_dir, ("arena", "sharegpt")) if t not in used]
    rng.shuffle(pool)
    rows = []
    for text in pool[:groups]:
        rows.append({"q1": text, "q2": reworded(text, rng), "label": 1, "group": text})
        rows += [{"q1": text, "q2": miss, "label": 0, "group": text}
                 for miss in near_misses(text, rng, pool, 1)]
    return rows


def qqp_replay(data_dir: Path, groups: int, neighbours: int, seed: int
               ) -> dict[str, tuple[list[Asked], list[str]]]:
    """Per dev half: every duplicate's q1 stored, ``groups`` of their q2 asked; with
    ``neighbours``, as many non-duplicate pairs' q1 stored too and their q2 asked (no
    stored question answers it, unless QQP links one to it), as the QQP stream mixes them
    (benchmarks/learning_stream.py: 3 questions in 10)."""
    halves: dict[str, list] = {"dev-a": [], "dev-b": []}
    others: dict[str, list] = {"dev-a": [], "dev-b": []}
    for p in load_qqp(data_dir, "dev"):
        half = dev_half(Pair(p.q1.strip(), p.q2.strip(), p.label))
        (halves if p.label == 1 else others)[half].append(p)
    out = {}
    for half, duplicates in halves.items():
        near = sample(others[half], neighbours, seed) if neighbours else []
        stored = unique([*(p.q1 for p in duplicates), *(p.q1 for p in near)])
        index = {q: i for i, q in enumerate(stored)}
        asked = sample([Asked(p.q2, half, stored, index[p.q1]) for p in duplicates], groups,
                       seed)
        out[half] = ([*asked, *(Asked(p.q2, half, stored, None) for p in near)], stored)
    return out


# features -----------------------------------------------------------------------------
def record(asked: Asked, cosines: np.ndarray, order: np.ndarray, recall_tau: float,
           verifier: LearnedVerifier, links: dict[str, str] | None) -> dict:
    """What the client's decision sees for one question, and what would be right."""
    texts = [asked.stored[j] for j in order]
    cos = [float(cosines[j]) for j in order]
    right = [bool(asked.own == j) for j in order]
    if links is not None:
        right = [r or same_group(links, asked.query, t) for r, t in zip(right, texts, strict=True)]
    counting = [i for i in range(len(texts)) if cos[i] >= recall_tau][:VERIFIED_AT_MOST]
    same = [i for i in counting if embedding_text(texts[i]) == embedding_text(asked.query)]
    probabilities: list[float] = []
    if counting and not same:
        probabilities = [float(p) for p in
                         verifier.probabilities(asked.query, [texts[i] for i in counting])]
    return {"query": asked.query, "texts": texts, "cosines": cos, "right": right,
            "own": [bool(asked.own == j) for j in order], "answerable": asked.own is not None,
            "counting": len(counting), "same": same[0] if same else None,
            "probabilities": probabilities,
            "vetoed": [verify(asked.query, texts[i], WITH_LEARNED) is not None
                       for i in range(len(counting))]}


def pair_records(name: str, rows: list[dict], encoder: Encoder, recall_tau: float,
                 verifier: LearnedVerifier, cache_dir: Path, seed: int | None = None
                 ) -> list[dict]:
    """A near-miss set's pairs as lookups: q1 stored, q2 asked (one candidate each); all
    in the test split, or with ``seed`` split by each row's group."""
    a = embed_cached(encoder, [embedding_text(r["q1"]) for r in rows], cache_dir)
    b = embed_cached(encoder, [embedding_text(r["q2"]) for r in rows], cache_dir)
    return [{"domain": name,  # keys in this order: a card's data_sha256 hashes the bytes
             "split": "test" if seed is None else split_of(seed, r["group"]),
             "group": r.get("group", str(i)),
             **record(Asked(r["q2"], str(i), [r["q1"]], 0 if r["label"] == 1 else None),
                      np.array([a[i] @ b[i]]), np.array([0]), recall_tau, verifier, None)}
            for i, r in enumerate(rows)]


def collect(args: argparse.Namespace) -> tuple[list[dict], Path]:
    """Every asked question's record, computed once and kept in --work."""
    verifier = LearnedVerifier.load(args.verifier)
    wider = [] if args.recall_margin == RECALL_MARGIN else ["recall margin",
                                                             args.recall_margin]
    wider += ["qqp neighbours", args.qqp_neighbours] if args.qqp_neighbours else []
    key = hashlib.sha256(json.dumps([args.groups, args.seed, verifier.version, DOMAINS,
                                     "v1", *([LONE, args.lone] if args.lone else []),
                                     *wider]).encode()).hexdigest()[:12]
    path = args.work / f"records-{key}.jsonl"
    if path.is_file():
        note(f"records from {path}")
        return [json.loads(line) for line in path.open()], path
    encoder = load_encoder("onnx-int8", args.cache_dir, model="mpnet")
    tau = profile_threshold("mpnet")
    recall_tau = tau - args.recall_margin
    links = linked_groups(args.data_dir)
    sets: list[tuple[str, str, list[Asked], list[str], bool]] = []
    for half, (asked, stored) in qqp_replay(args.data_dir, args.groups, args.qqp_neighbours,
                                            args.seed).items():
        sets.append(("qqp", "choose" if half == "dev-a" else "test", asked, stored, True))
    for domain, names, misses, seed in (("arena", ("arena",), 0, args.seed),
                                        ("dense", ("sharegpt", "arena"), 2, args.seed + 1)):
        asked, stored = generated(args.data_dir, names, args.groups, misses, seed)
        for split in ("choose", "test"):
            sets.append((domain, split, [a for a in asked
                                         if split_of(args.seed, a.group) == split],
                         stored, False))
    records = []
    for domain, split, asked, stored, linked in sets:
        note(f"{domain} {split}: {len(asked)} asked of {len(stored)} stored")
        sv = embed_cached(encoder, [embedding_text(t) for t in stored], args.cache_dir)
        qv = embed_cached(encoder, [embedding_text(a.query) for a in asked], args.cache_dir)
        sims = qv @ sv.T
        for i, a in enumerate(asked):
            order = np.argsort(-sims[i])[:CANDIDATES]
            records.append({"domain": domain, "split": split, "group": a.group,
                            **record(a, sims[i], order, recall_tau, verifier,
                                     links if linked else None)})
    for name, source in ((HELD_OUT, NEAR_MISS), (TUNING, RULES_NEAR_MISS)):
        records += pair_records(name, near_miss_rows(source), encoder, recall_tau, verifier,
                                args.cache_dir)
    if args.lone:
        used = {t for *_, stored, _ in sets for t in stored}
        rows = lone_rows(args.data_dir, args.lone, args.seed + 2, used)
        note(f"{LONE}: {len(rows)} pairs of {args.lone} sentences stored alone")
        records += pair_records(LONE, rows, encoder, recall_tau, verifier, args.cache_dir,
                                args.seed)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    note(f"wrote {path}")
    return records, path



# deciders -----------------------------------------------------------------------------
@dataclass
class Study:
    """The records as arrays: per question the pick's features and what each decider
    would serve, and whether that is right."""

    records: list[dict]
    tau: float
    recall_tau: float
    threshold: float  # the verifier card's
    lone_logit: bool = False  # the experimental LONE_LOGIT feature beside FEATURES

    @property
    def names(self) -> tuple[str, ...]:
        return FEATURES + ((LONE_LOGIT,) if self.lone_logit else ())

    def features(self, cosines: list[float], probabilities: list[float]) -> np.ndarray:
        """``decision.features`` (and with ``lone_logit`` the pick's logit again where it is
        the only candidate, 0 elsewhere)."""
        x = features(cosines, probabilities, self.recall_tau, self.threshold)
        return np.append(x, x[0] if len(probabilities) == 1 else 0.0) if self.lone_logit else x

    def __post_init__(self) -> None:
        r = self.records
        self.domain = np.array([x["domain"] for x in r])
        self.split = np.array([x["split"] for x in r])
        self.answerable = np.array([x["answerable"] for x in r])
        self.same = np.array([x["same"] is not None for x in r])
        self.scored = np.array([bool(x["probabilities"]) for x in r])
        tops = [int(np.argmax(x["probabilities"])) if x["probabilities"] else 0 for x in r]
        self.pick_right = np.array([bool(x["right"][x["same"]]) if x["same"] is not None
                                    else bool(x["probabilities"]) and bool(x["right"][t])
                                    for x, t in zip(r, tops, strict=True)])
        self.pick_own = np.array([bool(x["own"][x["same"]]) if x["same"] is not None
                                  else bool(x["probabilities"]) and bool(x["own"][t])
                                  for x, t in zip(r, tops, strict=True)])
        self.nearest_own = np.array([bool(x["own"][0]) if x["texts"] else False for x in r])
        self.p1 = np.array([max(x["probabilities"]) if x["probabilities"] else 0.0 for x in r])
        self.ambiguous = np.array([bool(x["probabilities"]) and
                                   ambiguous(np.array(x["probabilities"]), self.threshold)
                                   for x in r])
        self.vetoed = np.array([bool(x["probabilities"]) and x["vetoed"][t]
                                for x, t in zip(r, tops, strict=True)])
        self.x = np.array([self.features(x["cosines"][:x["counting"]], x["probabilities"])
                           if x["probabilities"] else np.zeros(len(self.names)) for x in r])
        self.nearest = np.array([x["cosines"][0] >= self.tau if x["texts"] else False
                                 for x in r])
        self.nearest_right = np.array([bool(x["right"][0]) if x["texts"] else False
                                       for x in r])

    def where(self, domain: str, split: str) -> np.ndarray:
        return (self.domain == domain) & (self.split == split)

    def served(self, system: str, scores: np.ndarray | None = None, t: float = 0.0
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(served, right, right counting only the question's own stored one) per
        question for ``system``."""
        if system == "embedding only":
            return (self.nearest, self.nearest & self.nearest_right,
                    self.nearest & self.nearest_own)
        if system == "verifier alone":
            gate = self.p1 >= self.threshold
        elif system == "default (rules)":
            gate = (self.p1 >= self.threshold) & ~self.ambiguous & ~self.vetoed
        else:
            assert scores is not None
            gate = scores >= t
            if "floor" in system:  # the verifier's own threshold kept
                gate &= self.p1 >= self.threshold
            if "ambiguity" in system:
                gate &= ~self.ambiguous
            if "kept rules" in system:
                gate &= ~self.vetoed
            if "lone pick" in system:
                gate &= (self.p1 >= self.threshold) | (self.x[:, FEATURES.index("count")] > 1)
        served = self.same | (self.scored & gate)
        return served, served & self.pick_right, served & self.pick_own


def narrowed(records: list[dict], recall_tau: float) -> list[dict]:
    """The records as a smaller recall margin would have made them: only the candidates
    at or over ``recall_tau`` count (a prefix: they come most similar first)."""
    out = []
    for r in records:
        n = sum(c >= recall_tau for c in r["cosines"][:r["counting"]])
        same = r["same"] if r["same"] is not None and r["same"] < n else None
        out.append({**r, "counting": n, "same": same,
                    "probabilities": r["probabilities"][:n] if same is None else [],
                    "vetoed": r["vetoed"][:n]})
    return out


def quality(study: Study, mask: np.ndarray, served: np.ndarray, right: np.ndarray
            ) -> dict[str, float]:
    s, r, a = served[mask], right[mask], study.answerable[mask]
    return {"precision": r.sum() / s.sum() if s.sum() else 1.0,
            "hit rate": (s & a).sum() / a.sum() if a.sum() else 0.0,
            "unanswerable served": (s & ~a).sum() / (~a).sum() if (~a).sum() else float("nan"),
            "served": int(s.sum()), "wrong": int((s & ~r).sum()), "asked": int(mask.sum())}


def fit(study: Study, train: np.ndarray, signs: dict[str, int] | None = None
        ) -> tuple[np.ndarray, float]:
    """A logistic regression on the standardised features (L2, C = 1, as scikit-learn's
    default), returned as coefficients on the raw features and an intercept.

    ``signs`` (``decision.SIGNS``) bounds each coefficient to the direction it must have
    a priori (``SIGNS`` says why): not negative on logit_p1, logit_gap, cos_pick,
    cos_margin and pick_is_nearest, not positive on p2 and cos_nearest_gap, free on count
    and count_over (no direction before the data). Standardising divides by a positive
    scale, so a bound on a standardised coefficient is the same bound on the raw one. The
    bounded fit minimises the same penalised logistic loss with scipy's L-BFGS-B; without
    ``signs``, scikit-learn's unbounded fit (the card shipped before).
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    rows = train & study.scored & ~study.same
    scaler = StandardScaler().fit(study.x[rows])
    x, y = scaler.transform(study.x[rows]), study.pick_right[rows].astype(np.float64)
    if signs is None:
        model = LogisticRegression(C=1.0, max_iter=1000).fit(x, y)
        coef, intercept = model.coef_[0], float(model.intercept_[0])
    else:
        coef, intercept = bounded_logistic(x, y, [{**signs, LONE_LOGIT: +1}[f]
                                                  for f in study.names])
    w = coef / scaler.scale_
    b = float(intercept - (coef * scaler.mean_ / scaler.scale_).sum())
    return w, b


def bounded_logistic(x: np.ndarray, y: np.ndarray, signs: list[int]
                     ) -> tuple[np.ndarray, float]:
    """Coefficients and intercept minimising sum(log-loss) + ||w||^2 / 2 with each
    coefficient's sign bounded (+1: >= 0, -1: <= 0, 0: free); the intercept is free."""
    from scipy.optimize import minimize

    def loss(theta: np.ndarray) -> tuple[float, np.ndarray]:
        w, b = theta[:-1], theta[-1]
        z = x @ w + b
        residual = 1.0 / (1.0 + np.exp(-z)) - y
        value = float(np.logaddexp(0.0, z).sum() - (y * z).sum() + 0.5 * w @ w)
        return value, np.r_[x.T @ residual + w, residual.sum()]

    bounds = [(0.0, None) if s > 0 else (None, 0.0) if s < 0 else (None, None)
              for s in signs] + [(None, None)]
    result = minimize(loss, np.zeros(x.shape[1] + 1), jac=True, method="L-BFGS-B",
                      bounds=bounds, options={"maxiter": 10_000, "gtol": 1e-8})
    if not result.success:
        raise SystemExit(f"the bounded logistic fit did not converge: {result.message}")
    return result.x[:-1], float(result.x[-1])


def scores_of(study: Study, w: np.ndarray, b: float) -> np.ndarray:
    return scores_of_x(study.x, w, b)


def scores_of_x(x: np.ndarray, w: np.ndarray, b: float) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x @ w + b, -50, 50)))


def choose_threshold(study: Study, system: str, scores: np.ndarray, target: float,
                     near_misses: float, every_choose_split: bool = False) -> float | None:
    """The lowest score at which every domain's choose split is served with a hit
    precision of at least ``target`` and at most ``near_misses`` of the rules' tuning
    set's near-misses are served (the set the kept rules were chosen on), and with
    ``every_choose_split`` of each choose split's code-made near-misses too; None if
    none."""
    capped = [study.where(TUNING, "test"), study.where(LONE, "choose")]  # lone: if any
    if every_choose_split:
        capped += [study.where(d, "choose") for d in DOMAINS]
    for t in np.round(np.arange(0.05, 1.0, 0.005), 3):
        served, right, _ = study.served(system, scores, t)
        if all(quality(study, study.where(d, "choose"), served, right)["precision"] >= target
               for d in DOMAINS) and \
                not any(quality(study, mask, served, right)["unanswerable served"] > near_misses
                        for mask in capped):  # a split without near-misses gives nan: kept
            return float(t)
    return None


def choose_hit_rate(study: Study, system: str, scores: np.ndarray, t: float) -> float:
    """The mean hit rate of the choose splits: what picks the variant shipped."""
    served, right, _ = study.served(system, scores, t)
    return float(np.mean([quality(study, study.where(d, "choose"), served, right)["hit rate"]
                          for d in DOMAINS]))


def records_parser(doc: str | None, groups: int) -> argparse.ArgumentParser:
    """The options that name the records (--work, --groups, --verifier): the study's own,
    and those of the benchmarks that read its records (bound_start.py, decision_refit.py),
    whose records are the shipped card's (no lone sentences, no QQP neighbours, the
    client's recall margin)."""
    parser = base_parser(doc)
    parser.add_argument("--work", type=Path, default=Path("/tmp/decision_study"),
                        help="where the computed records are kept (outside the repo)")
    parser.add_argument("--groups", type=int, default=groups,
                        help="asked questions per QQP half, stored groups per generated "
                        "domain")
    parser.add_argument("--verifier", type=Path, default=ARTEFACT_DIR,
                        help="the verifier card's directory (default: the shipped one)")
    parser.set_defaults(lone=0, qqp_neighbours=0, recall_margin=RECALL_MARGIN)
    return parser


def variant_of(keeps: Iterable[str]) -> str:
    """The name of the learned variant that keeps these hand-made parts (a card's
    ``keeps``), as ``Study.served`` reads it."""
    kept = set(keeps)
    return " + ".join(["learned", *(k for k in KEEPS if k in kept)])


def choice_options(parser: argparse.ArgumentParser) -> None:
    """What a threshold is chosen for on the choose splits (this study's card and
    cascade_study.py's teacher card and band alike)."""
    parser.add_argument("--precision", type=float, default=0.97,
                        help="the hit precision the threshold is chosen for (choose splits)")
    parser.add_argument("--near-misses", type=float, default=0.05,
                        help="the share of the rules' tuning set's near-misses the threshold "
                        "may serve")


def parse_args() -> argparse.Namespace:
    parser = records_parser(__doc__, groups=1500)
    choice_options(parser)
    parser.add_argument("--cap-choose-splits", action="store_true",
                        help="hold --near-misses on every choose split's code-made "
                        "near-misses too, not only on the rules' tuning set")
    parser.add_argument("--lone", type=int, default=0,
                        help="also N new sentences each stored alone, asked reworded and as "
                        "a code-made near-miss: fitted on and capped on its choose split, "
                        "reported on its test split (0: none, as the shipped card)")
    parser.add_argument("--lone-logit", action="store_true",
                        help="an experiment: the pick's logit again as its own feature where "
                        "it is the only candidate (no card is written)")
    parser.add_argument("--qqp-neighbours", type=int, default=0,
                        help="also N non-duplicate QQP pairs per dev half: q1 stored, q2 "
                        "asked, answered by nothing stored (0: only duplicates asked, as the "
                        "shipped card)")
    parser.add_argument("--recall-margin", type=float, default=RECALL_MARGIN,
                        help="candidates from this far under tau (default: the client's "
                        "recall_margin); the ablation narrows it to each smaller margin")
    parser.add_argument("--write-card", type=Path, help="write the fitted decision's card")
    return parser.parse_args()


# The learned decision alone and with each hand-made part kept beside it: the verifier's
# threshold as a floor on the pick's probability, the ambiguity rule, the kept rules.
LEARNED = ("learned", "learned + floor", "learned + ambiguity rule", "learned + kept rules",
           "learned + floor + kept rules", "learned + ambiguity rule + kept rules")
SYSTEMS = ("embedding only", "verifier alone", "default (rules)", *LEARNED)
# With --lone, one more variant (no card can say it yet): the verifier's own threshold
# kept for a lone pick only, as a crowded one is the learned decision's alone.
LONE_VARIANT = "learned + verifier for a lone pick + kept rules"


def report(study: Study, scores: np.ndarray, thresholds: dict[str, float],
           systems: tuple[str, ...] | None = None) -> None:
    """Every split's quality per decider (``systems``: only those)."""
    table = make_table(["domain", "split", "decider", "asked", "served", "wrong",
                        "hit precision", "own question only", "hit rate",
                        "near-misses asked: served"], right_from=3)
    for domain in (*DOMAINS, LONE, TUNING, HELD_OUT):
        for split in ("choose", "test"):
            mask = study.where(domain, split)
            if not mask.any():
                continue
            for system in systems or (*SYSTEMS, *(s for s in thresholds if s not in SYSTEMS)):
                served, right, own = study.served(system, scores, thresholds.get(system, 0))
                q = quality(study, mask, served, right)
                o = quality(study, mask, served, own)
                table.add_row(domain, split, system, str(q["asked"]), str(q["served"]),
                              str(q["wrong"]), pct(q["precision"]),
                              pct(o["precision"]) if domain == "qqp" else "-",
                              pct(q["hit rate"]),
                              pct(q["unanswerable served"])
                              if np.isfinite(q["unanswerable served"]) else "-")
    print_table(table)


def card(study: Study, fitting: Fitting, verifier: LearnedVerifier, encoder: Encoder,
         records_path: Path) -> dict:
    keeps = [k for k in KEEPS if k.split()[0] in fitting.shipped]
    body = {"features": list(FEATURES),
            "coefficients": [round(float(c), 6) for c in fitting.w],
            "intercept": round(fitting.b, 6), "threshold": fitting.thresholds[fitting.shipped],
            "keeps": keeps, "verifier_sha256": verifier.card.sha256,
            "encoder": MPNET.name, "encoder_version": encoder.model_version,
            "data_sha256": hashlib.sha256(records_path.read_bytes()).hexdigest(),
            "command": "python benchmarks/decision_study.py " + " ".join(sys.argv[1:])}
    body["evidence"] = evidence(study, fitting, body)
    return {**body, "sha256": card_digest(body)}


def evidence(study: Study, fitting: Fitting, body: dict) -> dict:
    """The card's evidence for the error bound (shared.verifier.decision): every pick of
    the choose splits the card's hand-made parts let through (one they refuse is never
    served, so never labelled), as a label at the card's score (its rounded coefficients,
    as a device computes it), wrong where serving it would be; the very same question
    (served by identity) is no label. Binned as federated learning pools labels."""
    scores = scores_of_x(study.x, np.array(body["coefficients"]), body["intercept"])
    let_through, _, _ = study.served(fitting.shipped, scores, -np.inf)
    rows = (np.isin(study.domain, (*DOMAINS, LONE)) & (study.split == "choose")
            & study.scored & ~study.same & let_through)
    note(f"the card's evidence: {int(rows.sum())} picks of the choose splits, "
         f"{int((~study.pick_right[rows]).sum())} of them wrong")
    return BoundEvidence.of_labels(scores[rows], ~study.pick_right[rows],
                                   np.ones(int(rows.sum()))).to_record()


# The fits compared: scikit-learn's unbounded one (the card shipped first), the signs
# bounded with cos_margin left free, and the signs of ``decision.SIGNS``.
FITS: dict[str, dict[str, int] | None] = {
    "unconstrained": None, "signs, cos_margin free": {**SIGNS, "cos_margin": 0},
    "signs (SIGNS)": SIGNS}


@dataclass
class Fitting:
    """One fit on the choose splits: its coefficients, scores, the threshold chosen there
    for each learned variant, and the variant it would ship (highest mean choose hit
    rate; ties: fewer parts)."""

    name: str
    w: np.ndarray
    b: float
    scores: np.ndarray
    thresholds: dict[str, float]
    rates: dict[str, float]

    @property
    def shipped(self) -> str:
        return max(self.rates, key=lambda s: (round(self.rates[s], 3), -len(s)))


def fitted(study: Study, name: str, args: argparse.Namespace,
           systems: tuple[str, ...] = LEARNED) -> Fitting:
    """The decision fitted (``FITS[name]``) on ``study``'s choose splits, with the
    threshold chosen there for each of ``systems``."""
    w, b = fit(study, np.isin(study.domain, (*DOMAINS, LONE)) & (study.split == "choose"),
               FITS[name])
    scores = scores_of(study, w, b)
    chosen = {s: choose_threshold(study, s, scores, args.precision, args.near_misses,
                                  args.cap_choose_splits)
              for s in systems}
    thresholds = {s: t for s, t in chosen.items() if t is not None}
    rates = {s: choose_hit_rate(study, s, scores, t) for s, t in thresholds.items()}
    note(f"{name}: thresholds chosen on the choose splits: {chosen}; mean choose hit "
         f"rate {rates}")
    return Fitting(name, w, b, scores, thresholds, rates)


def compare(study: Study, fittings: list[Fitting], examples: dict[str, np.ndarray]) -> None:
    """The fits side by side, each as the variant it would ship at the threshold chosen
    on the choose splits: precision @ hit rate on every split (the test splits were used
    for no choice) and the held-out near-miss set; then the scores of lone picks seen by
    hand (served where the score reaches the threshold)."""
    table = make_table(["fit", "variant @ threshold", "mean choose hit rate", "split",
                        *DOMAINS, "held-out: near-misses served / paraphrases hit"],
                       right_from=2)
    for f in fittings:
        served, right, _ = study.served(f.shipped, f.scores, f.thresholds[f.shipped])
        held = quality(study, study.where(HELD_OUT, "test"), served, right)
        for split in ("choose", "test"):
            cells = []
            for domain in DOMAINS:
                q = quality(study, study.where(domain, split), served, right)
                cells.append(f"{pct(q['precision'])} @ {pct(q['hit rate'])}")
            first = split == "choose"
            table.add_row(f.name if first else "",
                          f"{f.shipped} @ {f.thresholds[f.shipped]:.3f}" if first else "",
                          pct(f.rates[f.shipped]) if first else "", split, *cells,
                          "" if first else f"{pct(held['unanswerable served'])} / "
                          f"{pct(held['hit rate'])}")
    print_table(table)
    table = make_table(["fit", "threshold", *examples], right_from=1)
    for f in fittings:
        table.add_row(f.name, f"{f.thresholds[f.shipped]:.3f}",
                      *(f"{float(scores_of_x(x, f.w, f.b)):.3f}" for x in examples.values()))
    print_table(table)


def margin_ablation(records: list[dict], tau: float, threshold: float,
                    args: argparse.Namespace, shipped: Fitting) -> None:
    """The shipped fit and variant refitted with the recall margins the records allow
    (--recall-margin and every smaller one of ``MARGINS``): whether candidates between the
    recall tau and tau help it (the test splits), and what each margin serves of the
    held-out near-miss set (reported only)."""
    table = make_table(["recall margin", "threshold", "mean choose hit rate",
                        *(f"{d} test: precision @ hit rate" for d in DOMAINS),
                        "held-out: near-misses served / paraphrases hit"], right_from=1)
    system = shipped.shipped
    for margin in sorted({args.recall_margin, *(m for m in MARGINS
                                                if m <= args.recall_margin)}, reverse=True):
        study = Study(narrowed(records, tau - margin), tau, tau - margin, threshold,
                      args.lone_logit)
        f = fitted(study, shipped.name, args, (system,))
        if system not in f.thresholds:
            table.add_row(f"{margin:.2f}", "none", "-", *("-" for _ in DOMAINS), "-")
            continue
        served, right, _ = study.served(system, f.scores, f.thresholds[system])
        cells = []
        for d in DOMAINS:
            q = quality(study, study.where(d, "test"), served, right)
            cells.append(f"{pct(q['precision'])} @ {pct(q['hit rate'])}")
        held = quality(study, study.where(HELD_OUT, "test"), served, right)
        table.add_row(f"{margin:.2f}", f"{f.thresholds[system]:.3f}", pct(f.rates[system]),
                      *cells, f"{pct(held['unanswerable served'])} / {pct(held['hit rate'])}")
    print_table(table)


def trees_ablation(study: Study, system: str, args: argparse.Namespace) -> None:
    """A tiny gradient-boosted tree ensemble on the same rows beside the logistic model:
    whether a non-linear decision would serve more (not shipped either way)."""
    from sklearn.ensemble import HistGradientBoostingClassifier

    rows = np.isin(study.domain, DOMAINS) & (study.split == "choose") & study.scored \
        & ~study.same
    model = HistGradientBoostingClassifier(max_depth=3, max_iter=100, random_state=args.seed)
    model.fit(study.x[rows], study.pick_right[rows])
    scores = model.predict_proba(study.x)[:, 1]
    t = choose_threshold(study, system, scores, args.precision, args.near_misses,
                         args.cap_choose_splits)
    if t is None:
        note("trees: no threshold meets the choose constraints")
        return
    served, right, _ = study.served(system, scores, t)
    table = make_table(["model", "threshold", *(f"{d} test: precision @ hit rate"
                                                for d in DOMAINS)], right_from=1)
    table.add_row(f"trees ({system})", f"{t:.3f}", *(
        "{} @ {}".format(pct(q["precision"]), pct(q["hit rate"])) for q in
        (quality(study, study.where(d, "test"), served, right) for d in DOMAINS)))
    print_table(table)


def main() -> None:
    args = parse_args()
    if args.lone_logit and args.write_card:
        raise SystemExit("--write-card with --lone-logit: the client's decision has no "
                         "lone_logit feature, so no card can be written")
    print_command()
    records, path = collect(args)
    verifier = LearnedVerifier.load(args.verifier)
    tau = profile_threshold("mpnet")
    study = Study(records, tau, tau - args.recall_margin, verifier.threshold,
                  args.lone_logit)
    fittings = [fitted(study, name, args, (*LEARNED, LONE_VARIANT) if args.lone else LEARNED)
                for name in FITS]
    table = make_table(["feature", "sign a priori", *(f.name for f in fittings)],
                       right_from=1)
    for i, name in enumerate(study.names):
        table.add_row(name, {1: ">= 0", -1: "<= 0", 0: "free"}[{**SIGNS, LONE_LOGIT: +1}[name]],
                      *(f"{f.w[i]:+.4f}" for f in fittings))
    table.add_row("intercept", "free", *(f"{f.b:+.4f}" for f in fittings))
    print_table(table)
    # "What's the capital city of France?" against a stored "What is the capital of
    # France?" alone: MPNet cosine 0.90, the verifier's p 0.37 (the chat's example).
    examples = {f"lone: cos {c:.2f}, p {p:.2f}": study.features([c], [p])
                for c, p in ((0.90, 0.37), (0.95, 0.37), (0.80, 0.37), (0.90, 0.20))}
    compare(study, fittings, examples)
    best = max(fittings, key=lambda f: f.rates[f.shipped])
    note(f"shipped: the {best.name} fit (the highest mean choose hit rate with every "
         f"choose split at >= {pct(args.precision)} hit precision), {best.shipped} at "
         f"{best.thresholds[best.shipped]}")
    report(study, best.scores, best.thresholds)
    if args.lone_logit or best.shipped == LONE_VARIANT:  # no card: the client has neither
        note(f"no card: the client's decision cannot run {best.shipped}" if not
             args.lone_logit else "no card: the client's decision has no lone_logit")
        margin_ablation(records, tau, verifier.threshold, args, best)
        return
    encoder = load_encoder("onnx-int8", args.cache_dir, model="mpnet")
    out = card(study, best, verifier, encoder, path)
    decision = LearnedDecision.from_card(out)
    scored = [r for r in records if r["probabilities"]]
    cost = time_each(lambda r: decision.serves(r["cosines"][:r["counting"]],
                                               r["probabilities"], study.recall_tau,
                                               study.threshold), scored, scored[:50])
    note(f"the learned decision's cost per lookup: p50 {cost.p50 * 1000:.1f} us, "
         f"p99 {cost.p99 * 1000:.1f} us ({cost.n} lookups)")
    first = first_threshold(decision)
    note(f"{best.shipped} at {first:.3f}, where a new device's error bound starts on the "
         "card's own labels (the default max_wrong_rate):")
    report(study, best.scores, {best.shipped: first}, (best.shipped,))
    margin_ablation(records, tau, verifier.threshold, args, best)
    trees_ablation(study, best.shipped, args)
    if args.write_card:
        args.write_card.write_text(json.dumps(out, indent=2) + "\n", encoding="utf-8")
        note(f"wrote {args.write_card}")


if __name__ == "__main__":
    main()
