"""FedAvg of the encoder's federated weights, plus the threshold: the global threshold
goes out with every round, and is the mean of the thresholds devices sent back, weighted
by their example counts. Devices that trained nothing (weight 0) are left out.

The mean runs over all rounds so far, not just the last: a round samples a few devices
whose small validation sets give jumpy thresholds (a per-round mean swung by +-0.03
between rounds in benchmarks/fl_quality.py), while the model moves slowly."""

import logging
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg

log = logging.getLogger(__name__)


class ThresholdFedAvg(FedAvg):
    def __init__(self, threshold: float, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.threshold = threshold
        self.threshold_examples = 0.0  # how many examples the current threshold rests on
        self.bytes_received: dict[int, dict[int, int]] = {}  # round -> node -> bytes

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config["threshold"] = self.threshold
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
        useful = [m for m in replies if m.has_error() or self._weight(m) > 0]
        if not any(m.has_content() for m in useful):
            log.warning("round %d: no device trained; the global model stays", server_round)
            return None, None
        arrays, metrics = super().aggregate_train(server_round, useful)
        if metrics is not None and "threshold" in metrics:
            examples = sum(self._weight(m) for m in useful if m.has_content())
            total = self.threshold_examples + examples
            self.threshold = (self.threshold * self.threshold_examples
                              + float(metrics["threshold"]) * examples) / total
            self.threshold_examples = total
        return arrays, metrics
