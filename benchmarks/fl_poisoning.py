"""How far poisoning devices move one round's global threshold and weights, by aggregation.

Honest devices send 60 validation pairs of similarity evidence whose best threshold lies
near 0.85 and small updates (norm ~0.5) around a shared direction; attackers claim 10^6
duplicate pairs at similarity 0.5 (their own best threshold: 0.5), 10^12 examples and an
update 1000 times an honest one. Each aggregation runs on the same replies with and
without the attackers; the table shows how far the attackers moved the global threshold
and the global weights. "plain FedAvg" is the design's example-weighted mean of the
devices' own thresholds with no screening; the others are meancache's ThresholdFedAvg
(fl_server/screening.py and fl_server/pooled_threshold.py with the app's defaults).

    python benchmarks/fl_poisoning.py                  # 5 devices, 200 trials
    python benchmarks/fl_poisoning.py --quick          # 20 trials
"""

import numpy as np
import torch
from _common import apply_defaults, base_parser, heading, make_table, print_command, print_table
from flwr.app import ArrayRecord, ConfigRecord, Message, Metadata, MetricRecord, RecordDict
from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.run_config import ServerConfig
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.fl.evidence import Evidence
from meancache.shared.threshold import best_threshold

TAU, DIM, PAIRS = 0.85, 1000, 60
Reply = tuple[Evidence, float, float, np.ndarray]  # evidence, own threshold, examples, update


def honest_reply(rng: np.random.Generator, direction: np.ndarray) -> Reply:
    labels = rng.random(PAIRS) < 0.4
    sims = np.where(labels, rng.normal(TAU + 0.04, 0.04, PAIRS),
                    rng.normal(TAU - 0.06, 0.05, PAIRS))
    return (Evidence.of_pairs(sims, labels), best_threshold(sims, labels).threshold,
            float(rng.integers(100, 300)), direction + rng.normal(size=DIM) * 0.2 / np.sqrt(DIM))


def message(node: int, reply: Reply) -> Message:
    sent = Message(RecordDict({"config": ConfigRecord({})}), metadata=Metadata(
        run_id=1, message_id=f"m{node}", src_node_id=0, dst_node_id=node,
        reply_to_message_id="", group_id="1", created_at=0.0, ttl=3600, message_type="train"))
    evidence, _, examples, update = reply
    return Message(RecordDict({
        "arrays": ArrayRecord({"w": torch.tensor(update, dtype=torch.float32)}),
        "metrics": MetricRecord({"num-examples": examples, "train-loss": 0.0, "skipped": 0,
                                 **evidence.to_metrics()})}), reply_to=sent)


def plain_fedavg(replies: list[Reply]) -> tuple[float, np.ndarray]:
    weights = np.array([r[2] for r in replies]) / sum(r[2] for r in replies)
    return (float(sum(w * r[1] for w, r in zip(weights, replies, strict=True))),
            sum(w * r[3] for w, r in zip(weights, replies, strict=True)))


def screened(aggregation: str, replies: list[Reply]) -> tuple[float, np.ndarray]:
    config = ServerConfig.from_run_config({**default_run_config(), "checkpoint-dir": "x"})
    strategy = ThresholdFedAvg(TAU, ArrayRecord({"w": torch.zeros(DIM)}), config.limits,
                               config.threshold_rule, aggregation, min_train_nodes=1,
                               min_available_nodes=1)
    arrays, _ = strategy.aggregate_train(1, [message(i, r) for i, r in enumerate(replies)])
    assert arrays is not None
    return strategy.threshold, arrays.to_torch_state_dict()["w"].numpy().astype(np.float64)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--devices", type=int, default=5, help="honest + attacking")
    parser.add_argument("--trials", type=int)
    args = apply_defaults(parser.parse_args(), {"trials": 200}, {"trials": 20})
    rng = np.random.default_rng(args.seed)
    aggregations = {"plain FedAvg": plain_fedavg,
                    "FedAvg + screening": lambda r: screened("fedavg", r),
                    "median + screening": lambda r: screened("median", r)}
    table = make_table(["attackers", "aggregation", "mean |d tau|", "max |d tau|",
                        "mean |d w|", "max |d w|"], right_from=2)
    for attackers in (1, 2):
        moved: dict[str, list[tuple[float, float]]] = {name: [] for name in aggregations}
        for _ in range(args.trials):
            direction = rng.normal(size=DIM) / np.sqrt(DIM) * 0.5
            honest = [honest_reply(rng, direction) for _ in range(args.devices - attackers)]
            liar = Evidence.of_pairs(np.full(10**6, 0.5), np.ones(10**6))
            attack = [(liar, 0.5, 1e12, direction * -1000.0)] * attackers
            for name, aggregate in aggregations.items():
                clean_tau, clean_w = aggregate(honest)
                tau, w = aggregate(honest + attack)
                moved[name].append((abs(tau - clean_tau), float(np.linalg.norm(w - clean_w))))
        for name, values in moved.items():
            taus, ws = np.array(values).T
            table.add_row(f"{attackers} of {args.devices}", name, f"{taus.mean():.4f}",
                          f"{taus.max():.4f}", f"{ws.mean():.3f}", f"{ws.max():.3f}")
    heading(f"One round, {args.devices} devices, {args.trials} trials: how far attackers "
            "(10^6 duplicates at 0.5, 10^12 examples, update x -1000) move the global model")
    print_table(table)
    print_command()


if __name__ == "__main__":
    main()
