"""FedAvg of the encoder's federated weights, plus the threshold: the global threshold
goes out with every round, and is the mean of the thresholds devices sent back, weighted
by their example counts. Devices that trained nothing (weight 0) are left out.

Every reply is screened first (fl_server.screening: unfit replies dropped, counts clamped,
updates and thresholds clipped), so one device cannot move either far. ``aggregation =
"median"`` is the robust option: the coordinate-wise median of the weights and the
example-weighted median of the thresholds, which ignore a minority of outliers entirely.

The mean runs over all rounds so far, not just the last: a round samples a few devices
whose small validation sets give jumpy thresholds (a per-round mean swung by +-0.03
between rounds in benchmarks/fl_quality.py), while the model moves slowly."""

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from meancache.fl_server.screening import ReplyLimits, Screened, screen

log = logging.getLogger(__name__)

AGGREGATIONS = ("fedavg", "median")


def weighted_median(values: list[float], weights: list[float]) -> float:
    """The value at which half the total weight lies on either side."""
    order = np.argsort(values)
    cumulative = np.cumsum(np.asarray(weights, dtype=np.float64)[order])
    index = int(np.searchsorted(cumulative, cumulative[-1] / 2))
    return float(np.asarray(values)[order][index])


def coordinate_median(replies: list[Message]) -> ArrayRecord:
    arrays = [m.content["arrays"] for m in replies]
    return ArrayRecord({name: Array(np.asarray(np.median(
        np.stack([a[name].numpy() for a in arrays]), axis=0)))
        for name in arrays[0]})


class ThresholdFedAvg(FedAvg):
    def __init__(self, threshold: float, arrays: ArrayRecord, limits: ReplyLimits,
                 aggregation: str = "fedavg", unweighted: bool = False,
                 **kwargs: Any) -> None:
        """``unweighted``: every device that replied counts once, whatever its example
        count (central DP: fl_server.privacy)."""
        super().__init__(**kwargs)
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, not {aggregation!r}")
        self.threshold = threshold
        self.global_arrays = arrays  # what devices were sent this round
        self.limits = limits
        self.aggregation = aggregation
        self.unweighted = unweighted
        self.threshold_examples = 0.0  # how many examples the current threshold rests on
        self.bytes_received: dict[int, dict[int, int]] = {}  # round -> node -> bytes
        self.screened: dict[int, Screened] = {}  # round -> what screening did

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config["threshold"] = self.threshold
        self.global_arrays = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord,
                           config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        config["threshold"] = self.threshold
        return super().configure_evaluate(server_round, arrays, config, grid)

    def _weight(self, message: Message) -> float:
        metrics = next(iter(message.content.metric_records.values()), {})
        return float(metrics.get(self.weighted_by_key, 0))

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        replies = list(replies)
        self.bytes_received[server_round] = {
            m.metadata.src_node_id: sum(r.count_bytes() for r in m.content.array_records.values())
            for m in replies if m.has_content()
        }
        screened = screen(replies, self.global_arrays, self.threshold, self.limits)
        self.screened[server_round] = screened
        if self.unweighted:
            for message in screened.kept:
                next(iter(message.content.metric_records.values()))[self.weighted_by_key] = 1
        useful = [m for m in screened.kept if self._weight(m) > 0]
        if not useful:
            log.warning("round %d: no device trained; the global model stays", server_round)
            return None, None
        weights = [self._weight(m) for m in useful]
        metrics = self.train_metrics_aggr_fn([m.content for m in useful], self.weighted_by_key)
        if self.aggregation == "median":
            arrays = coordinate_median(useful)
            metrics["threshold"] = weighted_median(
                [float(next(iter(m.content.metric_records.values()))["threshold"])
                 for m in useful], weights)
        else:
            arrays, _ = super().aggregate_train(server_round, useful)
        examples = sum(weights)
        total = self.threshold_examples + examples
        self.threshold = (self.threshold * self.threshold_examples
                          + float(metrics["threshold"]) * examples) / total
        self.threshold_examples = total
        return arrays, metrics
