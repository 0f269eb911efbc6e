"""What federated learning's evidence round costs a device, per label it scores anew.

After the last round a device scores its labels with the final global model's judges
(client/device_caches.device_rescored_evidence): the learned decision's score over the
global verifier, which weighs every candidate a label kept (up to five: the float global
verifier's probability of each, client/fl/rescore.py), and the global encoder's cosine of
the label's pair (two embeddings). The server awaits the reply ``round-timeout`` seconds
(600 by default), so the device scores its newest ``RESCORED_LABELS`` only. This times
both judges as a device runs them, on QQP questions: labels with five candidates, labels
with one (a label from before labels kept their candidates, or a "wrong answer"), and
the cosine judge, in alternating chunks so that their ratios come from one run, and says
what the budget and the most a device keeps (``KEPT``) would take.

    python benchmarks/evidence_cost.py
    python benchmarks/evidence_cost.py --quick
"""

import random
import statistics
import time
from collections.abc import Callable

import numpy as np
from _common import (
    apply_defaults,
    base_parser,
    heading,
    load_qqp,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
    qqp_questions,
)
from meancache.client.device_caches import RESCORED_LABELS, Asked
from meancache.client.fl.rescore import rescorer
from meancache.client.fl.train import pair_similarities
from meancache.client.learning.state import KEPT
from meancache.client.matching import matcher
from meancache.client.matching.settings import RECALL_MARGIN
from meancache.fl_server.app_declaration import default_run_config
from meancache.shared.encoder import locate_model
from meancache.shared.encoder.encoder import load_sentence_transformer
from meancache.shared.pairs import Pair
from meancache.shared.threshold import MPNET_THRESHOLD
from meancache.shared.verifier.federated import base_dir, base_verifier, pair_probabilities
from meancache.shared.verifier.runtime import read_card


def labels_of(questions: list[str], count: int, candidates: int, rng: random.Random
              ) -> list[Asked]:
    """``count`` labels, each a question weighed against ``candidates`` stored ones (the
    pick first, cosines falling from 0.95 as a lookup's are ordered)."""
    return [Asked(question, rng.sample(questions, candidates),
                  [0.95 - 0.02 * i for i in range(candidates)])
            for question in rng.sample(questions, count)]


def per_label_ms(fn: Callable[[list[Asked]], object], labels: list[Asked]) -> float:
    started = time.perf_counter()
    fn(labels)
    return (time.perf_counter() - started) * 1e3 / len(labels)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--labels", type=int, help="labels in each timed chunk")
    parser.add_argument("--chunks", type=int, help="chunks timed per way, alternating")
    parser.add_argument("--encoder", default="mpnet", help="the global encoder (a profile)")
    args = apply_defaults(parser.parse_args(), {"labels": 64, "chunks": 4},
                          {"labels": 16, "chunks": 1})
    rng = random.Random(args.seed)
    questions = qqp_questions(load_qqp(args.data_dir, "dev"))
    verifier = base_verifier(None)
    verifier.eval()
    decision = matcher.learned_decision()
    judge = f"{decision.judge} over {'0' * 64}"  # the card over a federated fine-tune
    encoder = load_sentence_transformer(locate_model(args.encoder, args.cache_dir / "models"))
    decided = rescorer(judge, lambda pairs: pair_probabilities(verifier, pairs),
                       lambda pairs: pair_similarities(encoder, pairs),
                       MPNET_THRESHOLD - RECALL_MARGIN, read_card(base_dir(None)).threshold)
    assert decided is not None

    def cosine(asked: list[Asked]) -> np.ndarray:
        return pair_similarities(encoder, [Pair(a.question, a.stored[a.pick], 1)
                                           for a in asked])

    ways = {"decision, 5 candidates": (decided, 5), "decision, 1 candidate": (decided, 1),
            "cosine of the pair": (cosine, 1)}
    print(machine_load())
    decided(labels_of(questions, 4, 5, rng))  # warm-up: first calls load and allocate
    cosine(labels_of(questions, 4, 1, rng))
    times: dict[str, list[float]] = {way: [] for way in ways}
    for chunk in range(args.chunks):
        for way, (fn, candidates) in ways.items():
            note(f"chunk {chunk + 1} of {args.chunks}: {way}")
            times[way].append(per_label_ms(fn, labels_of(questions, args.labels,
                                                         candidates, rng)))
    p50 = {way: statistics.median(found) for way, found in times.items()}
    table = make_table(["judge", "ms a label (median of chunks)",
                        f"{RESCORED_LABELS:,} labels, s", f"{KEPT:,} labels, s"])
    for way, ms in p50.items():
        table.add_row(way, f"{ms:.1f}", f"{ms * RESCORED_LABELS / 1e3:.0f}",
                      f"{ms * KEPT / 1e3:.0f}")
    both = p50["decision, 5 candidates"] + p50["cosine of the pair"]
    table.add_row("both judges, 5 candidates", f"{both:.1f}",
                  f"{both * RESCORED_LABELS / 1e3:.0f}", f"{both * KEPT / 1e3:.0f}")
    heading(f"the evidence round's scoring per label ({args.chunks} chunks of "
            f"{args.labels} labels a way; float global verifier, {args.encoder} encoder; the "
            f"reply is awaited {default_run_config()['round-timeout']:.0f} s)")
    print_table(table)
    print(f"5 candidates / 1: {p50['decision, 5 candidates'] / p50['decision, 1 candidate']:.1f}x")
    print(machine_load())
    print_command()


if __name__ == "__main__":
    main()
