"""Where the error bound could start on a new device (issue 37): the learned decision's own
choose splits, scored by the decision card, as the bound's evidence.

A device today serves on the card's threshold until its own labels pass Learn-then-Test
(client/learning/bound.py), so its first answers are backed by no label and a lower
``max_wrong_rate`` changes nothing until then. Shipped evidence would back them: here the
picks of benchmarks/decision_study.py's choose splits (QQP dev-a, arena, dense; the
records it keeps under --work, computed by it if missing), each a label at the card's
score (wrong where serving the pick is wrong; picks the kept rules veto are never
served, so never labelled), are tested as the bound tests a device's labels, with the
sequence starting at the first tail of ``labels_needed`` labels (today's) or of
``labels_to_pass(rate / 2)`` (a region wrong at half the rate can pass: fixed before any
label is seen). For each certified threshold, the test splits' service at it: share of
the asked served and share of those wrong. The choose splits fitted the card, so their
evidence is its fit's; the test splits were used for no choice.

    python benchmarks/bound_start.py --work /work/shipped-decide --groups 1000
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
from _common import make_table, note, pct, print_command, print_table
from decision_study import DOMAINS, Study, collect, records_parser, scores_of_x
from meancache.client.learning.bound import (
    Label,
    Rows,
    choose,
    labels_needed,
    labels_to_pass,
)
from meancache.client.matching.settings import RECALL_MARGIN
from meancache.shared.encoder import profile_threshold
from meancache.shared.verifier.decision import CARD_PATH
from meancache.shared.verifier.runtime import LearnedVerifier

RATES = (0.02, 0.03, 0.05)


def parse_args() -> argparse.Namespace:
    parser = records_parser(__doc__, groups=1000)  # the shipped card's
    parser.add_argument("--card", type=Path, default=CARD_PATH,
                        help="the decision card (default: the shipped one)")
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    print_command()
    card = json.loads(args.card.read_text(encoding="utf-8"))
    records, path = collect(args)
    verifier = LearnedVerifier.load(args.verifier)
    if card["verifier_sha256"] != verifier.card.sha256:
        raise SystemExit("the card was fitted on another verifier than --verifier's")
    tau = profile_threshold("mpnet")
    study = Study(records, tau, tau - RECALL_MARGIN, verifier.threshold)
    scores = scores_of_x(study.x, np.array(card["coefficients"], dtype=float),
                         float(card["intercept"]))
    labelled = study.scored & ~study.same & ~study.vetoed
    choose_rows = labelled & np.isin(study.domain, DOMAINS) & (study.split == "choose")
    wrong = ~study.pick_right[choose_rows]
    evidence = Rows.of([Label(float(score), bool(w)) for score, w in
                        zip(scores[choose_rows], wrong, strict=True)])
    over = scores[choose_rows] >= card["threshold"]
    note(f"{path.name}: {choose_rows.sum()} picks on the choose splits, {wrong.sum()} wrong; "
         f"over the card's threshold {card['threshold']}: {over.sum()}, "
         f"{wrong[over].sum()} wrong")
    table = make_table(["max_wrong_rate", "sequence starts at", "certified threshold",
                        "labels over it (wrong)", "upper limit",
                        *(f"{d} test: served (wrong)" for d in DOMAINS)], right_from=2)

    def served_at(threshold: float) -> list[str]:
        cells = []
        for domain in DOMAINS:
            asked = (study.domain == domain) & (study.split == "test")
            served = asked & labelled & (scores >= threshold)
            wrong_served = int((~study.pick_right[served]).sum())
            cells.append(f"{pct(served.sum() / asked.sum())} "
                         f"({pct(wrong_served / max(1, served.sum()))})")
        return cells

    table.add_row("the card", "-", f"{card['threshold']:.3f}", "-", "-",
                  *served_at(card["threshold"]))
    for rate in RATES:
        for name, start in (("labels_needed", labels_needed(rate)),
                            ("half the rate", labels_to_pass(rate / 2, rate))):
            bound = choose(evidence, rate, card["threshold"], start=start)
            if not bound.learned:
                table.add_row(pct(rate, 0), f"{name} ({start})", "none passes", "-", "-",
                              *("-" for _ in DOMAINS))
                continue
            errors = round((bound.estimate or 0.0) * bound.labels)
            table.add_row(pct(rate, 0), f"{name} ({start})", f"{bound.threshold:.3f}",
                          f"{bound.labels} ({errors})", pct(bound.upper, 2),
                          *served_at(bound.threshold))
    print_table(table)


if __name__ == "__main__":
    main()
