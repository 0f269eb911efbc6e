"""Would a device serve more at its error bound if it refitted the learned decision's
weights on its own labels? (issue 37: no fixed rule holds across traffic.)

The shipped decision card (shared/verifier/decision.json) is one logistic model fitted on
three domains' choose splits together; per domain the best weights differ (on QQP the
pick's cosine and the cosine margin carry weight, over all three together the sign-bounded
fit gives them none). This study takes benchmarks/decision_study.py's records (the same
options, the same --work folder) and, per domain and number of labels n drawn from its
choose split (a pick judged, not vetoed by the kept rules: what a device's bound counts),
compares on the domain's test split, never drawn from:

- the card's score, its threshold chosen by the device's bound (client.learning.bound's
  ``choose`` at --max-wrong-rate and 95% confidence) on the n labels;
- the decision refitted (decision_study's sign-bounded fit, ``SIGNS``) on half of the n
  labels, its threshold chosen by the bound on the other half, rescored: the score is
  fixed before the labels that test it are seen, as Learn-then-Test assumes;
- the same refit tested on the labels it was fitted on (optimistic: shows why the halves).

Every drawn record counts as labelled (as if every pick were sent upstream too); on a
device the misses are labelled and the would-be hits only at the exploration rate, whose
labels the bound weights by its inverse. The served variant is the card's (its ``keeps``).

    python benchmarks/decision_refit.py --work /work/probe/decide35
"""

from __future__ import annotations

import json

import numpy as np
from _common import make_table, note, pct, print_command, print_table
from decision_study import (
    DOMAINS,
    Study,
    collect,
    fit,
    quality,
    records_parser,
    scores_of,
    variant_of,
)
from meancache.client.learning.bound import NEVER, Label, choose
from meancache.shared.encoder import profile_threshold
from meancache.shared.verifier.decision import CARD_PATH, SIGNS
from meancache.shared.verifier.runtime import LearnedVerifier


def bound_threshold(scores: np.ndarray, wrong: np.ndarray, max_wrong_rate: float) -> float:
    """The threshold the device's bound chooses on these labels (each labelled for sure),
    serving nothing where no region passes."""
    labels = [Label(float(s), bool(w)) for s, w in zip(scores, wrong, strict=True)]
    return choose(labels, max_wrong_rate, prior=NEVER).threshold


def share_threshold(scores: np.ndarray, wrong: np.ndarray, share: float) -> float:
    """The lowest label score whose tail (the labels at or over it) is wrong at most
    ``share`` of the time, with no confidence asked: what the bound approaches as pooled
    labels grow (NEVER where no tail is)."""
    order = np.argsort(-scores, kind="stable")
    tail_wrong = np.cumsum(wrong[order]) / np.arange(1, len(order) + 1)
    ok = np.flatnonzero(tail_wrong <= share)
    return float(scores[order][ok[-1]]) if len(ok) else NEVER


def main() -> None:
    parser = records_parser(__doc__, groups=1000)  # the shipped card's
    parser.add_argument("--labels", type=int, nargs="+", default=[200, 400, 800],
                        help="labels a device has gathered (drawn from the choose split)")
    parser.add_argument("--draws", type=int, default=5, help="draws of the labels per n")
    parser.add_argument("--max-wrong-rate", type=float, default=0.02)
    parser.add_argument("--share", type=float, default=0.015,
                        help="the wrong share of the labels' tail for the no-confidence "
                        "threshold (what thousands of pooled labels let the bound reach)")
    args = parser.parse_args()
    print_command()
    records, _ = collect(args)
    verifier = LearnedVerifier.load(args.verifier)
    tau = profile_threshold("mpnet")
    study = Study(records, tau, tau - args.recall_margin, verifier.threshold)
    card = json.loads(CARD_PATH.read_text(encoding="utf-8"))
    if not card["verifier_sha256"].startswith(verifier.version):
        raise SystemExit("the decision card was fitted on another verifier than --verifier")
    system = variant_of(card["keeps"])
    card_scores = scores_of(study, np.array(card["coefficients"]), card["intercept"])
    judged = study.scored & ~study.same & ~study.vetoed
    wrong = ~study.pick_right
    rules = {f"the bound ({pct(args.max_wrong_rate)}, 95%)":
             lambda sc, wr: bound_threshold(sc, wr, args.max_wrong_rate),
             f"tail {pct(args.share)} wrong": lambda sc, wr: share_threshold(sc, wr, args.share)}
    table = make_table(["domain", "labels", "threshold by", "card's score",
                        "refit on half, threshold on the other", "refit, threshold, same labels"],
                       right_from=1)
    for domain in DOMAINS:
        pool = np.flatnonzero(study.where(domain, "choose") & judged)
        test = study.where(domain, "test")
        for n in args.labels:
            n = min(n, len(pool))
            cells = {rule: {"card": [], "halves": [], "same": []} for rule in rules}
            for draw in range(args.draws):
                drawn = np.random.default_rng([args.seed, draw, n]).permutation(pool)[:n]
                halves = drawn[0::2], drawn[1::2]
                fitted_on = np.zeros(len(study.records), dtype=bool)
                fitted_on[halves[0]] = True
                half_scores = scores_of(study, *fit(study, fitted_on, SIGNS))
                fitted_on[halves[1]] = True
                all_scores = scores_of(study, *fit(study, fitted_on, SIGNS))
                for rule, threshold in rules.items():
                    for kind, scores, on in (("card", card_scores, drawn),
                                             ("halves", half_scores, halves[1]),
                                             ("same", all_scores, drawn)):
                        t = threshold(scores[on], wrong[on])
                        cells[rule][kind].append(_tested(study, system, scores, t, test))
            for number, rule in enumerate(rules):
                table.add_row(domain if number == 0 else "", str(n), rule,
                              *(_cell(cells[rule][k]) for k in ("card", "halves", "same")))
    print_table(table)
    note(f"each cell: the test split's hit precision (over the {args.draws} draws' served "
         "answers) @ the mean hit rate (served / wrong summed over the draws)")


def _tested(study: Study, system: str, scores: np.ndarray, threshold: float,
            test: np.ndarray) -> dict:
    served, right, _ = study.served(system, scores, min(threshold, NEVER))
    return quality(study, test, served, right)


def _cell(results: list[dict]) -> str:
    served = sum(r["served"] for r in results)
    wrong = sum(r["wrong"] for r in results)
    precision = 1 - wrong / served if served else 1.0
    rate = float(np.mean([r["hit rate"] for r in results]))
    return f"{pct(precision)} @ {pct(rate)} ({served} / {wrong})"


if __name__ == "__main__":
    main()
