"""What the error bound costs a label and the lookup after it, as labels pile up.

A cache that learns keeps up to 20,000 labels (``client.learning.state.KEPT``); each new
one (a miss compared with its candidate, an explored hit, a "wrong answer") changes the
bound (Learn-then-Test over every labelled score, client/learning/bound.py). Since 1
December 2026 it is recomputed where the label is learned (``Learned.learn``, beside the
upstream call that brought it), so the lookup after it reads a ready bound; before, the
next lookup recomputed it. This measures, on a real store (DiskCache on disk) holding
--labels labels of a calibrated judge (score uniform, wrong with probability
0.1 (1 - score), a fifth of them explored at rate 0.1), alone and with a pool from
federated learning (5,000 other devices' labels, installed after a round took this
device's labels: the labels since are tested with it): a label learned (the store's write
and the recomputation), the lookup's read of the bound after it, and the recomputation
alone three ways, interleaved so that their ratios come from one run: as shipped (the
counted labels' rows kept in score order as labels come), with the rows kept in the order
they came (as on 28 November 2026: each recomputation sorts them) and as before 28
November (the rows read again from every label, the upper limit inverted for every row).

    python benchmarks/bound_cost.py
    python benchmarks/bound_cost.py --quick
"""

import random
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from unittest import mock

import numpy as np
from _common import (
    apply_defaults,
    base_parser,
    heading,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
)
from meancache.client.cache.store import EntryStore
from meancache.client.learning import bound
from meancache.client.learning.bound import Label, Rows
from meancache.client.learning.state import Learned, send_evidence
from meancache.shared.fl.bound_evidence import BoundEvidence
from scipy.special import betaincinv

JUDGE = "bench-judge"
PRIOR = 0.6


def inverting_every_row(errors: np.ndarray, n: np.ndarray, start: int,
                        max_wrong_rate: float, confidence: float) -> int:
    """The first failure found by inverting the Beta distribution for every row."""
    upper = np.where(errors >= n, 1.0,
                     betaincinv(errors + 1, np.maximum(n - errors, 1e-12), confidence))
    failed = start + np.flatnonzero(upper[start:] > max_wrong_rate)
    return int(failed[0]) if len(failed) else len(n)


def rows_read_again(learned: Learned) -> Rows:
    """The counted labels' rows read from every label, at each recomputation."""
    return Rows.of([label for label in learned.labels
                    if label.judge == learned.judge])


KEPT_IN_ORDER = Learned._own_rows  # as shipped: in score order


def rows_as_they_came(learned: Learned) -> Rows:
    """The counted labels' rows in the order they came (the same rows, not sorted)."""
    rows = KEPT_IN_ORDER(learned)
    return rows[np.argsort(learned._own_at, kind="stable")]


def draw(rng: random.Random, entries: int) -> Label:
    score = rng.random()
    explored = rng.random() < 0.2
    return Label(score, rng.random() < 0.1 * (1 - score), 0.1 if explored else 1.0,
                 entry=str(rng.randrange(entries)), source="explore" if explored else "miss",
                 judge=JUDGE)


def a_pool(rng: random.Random, labels: int) -> BoundEvidence:
    """Other devices' labels as federated learning pools them (binned sums)."""
    drawn = [draw(rng, 1) for _ in range(labels)]
    return replace(BoundEvidence.of_labels(
        np.array([label.score for label in drawn]),
        np.array([label.wrong for label in drawn], dtype=float),
        np.array([1 / label.labelled_with for label in drawn])), judge=JUDGE)


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return (time.perf_counter() - started) * 1e3


def measure(count: int, pooled: bool, repeats: int, seed: int) -> dict[str, list[float]]:
    """Milliseconds of a label learned, of the lookup's bound after it and of the
    recomputation three ways, interleaved."""
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as directory:
        store = EntryStore(Path(directory))
        learned = Learned(store, 0.02, prior=PRIOR, judge=JUDGE)
        for _ in range(count):
            learned.learn(draw(rng, max(1, count // 4)))
        if pooled:  # a round took the labels so far; the pool is tested with those since
            send_evidence(store, JUDGE)
            learned = Learned(store, 0.02, prior=PRIOR, judge=JUDGE)
            learned.install_pooled(a_pool(rng, 5_000))
        times: dict[str, list[float]] = {k: [] for k in (
            "label", "lookup", "sorted", "unsorted", "before")}

        def recomputed() -> float:
            learned.prior = None  # forget the bound, as a new label did before
            learned.prior = PRIOR
            return timed(lambda: learned.bound)

        for _ in range(repeats):
            times["label"].append(timed(lambda: learned.learn(
                draw(rng, max(1, count // 4)))))
            times["lookup"].append(timed(lambda: learned.bound))
            times["sorted"].append(recomputed())
            with mock.patch.object(Learned, "_own_rows", rows_as_they_came):
                times["unsorted"].append(recomputed())
            with mock.patch.object(bound, "_first_failure", inverting_every_row), \
                    mock.patch.object(Learned, "_own_rows", rows_read_again):
                times["before"].append(recomputed())
        store.close()
    return times


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--labels", type=int, nargs="+", help="label counts to measure")
    parser.add_argument("--repeats", type=int, help="recomputations timed per setting")
    args = apply_defaults(parser.parse_args(),
                          {"labels": [100, 1_000, 5_000, 20_000], "repeats": 40},
                          {"labels": [100, 2_000], "repeats": 5})
    print(machine_load())
    table = make_table(["labels", "pool", "a label ms", "the lookup after it ms",
                        "recompute ms", "rows as they came ms", "before 28 Nov ms",
                        "before / recompute"])
    for count in args.labels:
        for pooled in (False, True):
            note(f"{count} labels{', a pool' if pooled else ''}")
            times = measure(count, pooled, args.repeats, args.seed)
            p50 = {k: statistics.median(v) for k, v in times.items()}
            table.add_row(f"{count:,}", "5,000 labels" if pooled else "-",
                          f"{p50['label']:.2f}", f"{p50['lookup']:.3f}",
                          f"{p50['sorted']:.2f}", f"{p50['unsorted']:.2f}",
                          f"{p50['before']:.2f}", f"{p50['before'] / p50['sorted']:.1f}x")
    heading("the bound after a new label: recomputed as the label is learned, read by "
            "the lookup after it (p50), max_wrong_rate 0.02")
    print_table(table)
    print(machine_load())
    print_command()


if __name__ == "__main__":
    main()
