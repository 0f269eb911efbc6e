"""FedAvg of the encoder's federated weights, plus the threshold: the global threshold
goes out with every round and comes back tuned on the devices' pooled similarity evidence
(fl_server.pooled_threshold), moved only as far as that evidence supports. The devices'
error-bound evidence (shared.fl.bound_evidence: the verifier's labels and the cosine's,
two pools each naming its judge) is summed likewise, and the round's sums go out with the
next description of the global model (fl_server.round_model), signed: each device sends
all of its labels every time, so the newest round's sum replaces the last one (a round
with none keeps it).

Every reply is screened first (fl_server.screening: unfit replies dropped, counts and
evidence clamped, updates clipped), so one device cannot move either far.
``aggregation = "median"`` is the robust option for the weights: their coordinate-wise
median, which ignores a minority of outliers entirely.
"""

import logging
from collections.abc import Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import FedAvg
from meancache.fl_server.pooled_threshold import Pooled, ThresholdRule, pooled_threshold
from meancache.fl_server.round_model import RoundModels
from meancache.fl_server.run_config import AGGREGATIONS
from meancache.fl_server.screening import ReplyLimits, Screened, screen
from meancache.shared.fl.bound_evidence import (
    COSINE_KEYS,
    ROUND_COSINE_JUDGE,
    ROUND_JUDGE,
    BoundEvidence,
    round_pool,
)
from meancache.shared.fl.bound_evidence import KEYS as BOUND_KEYS
from meancache.shared.fl.checkpoint import DESCRIPTION_KEY
from meancache.shared.fl.evidence import KEYS, Evidence
from meancache.shared.fl.weights import VERIFIER

log = logging.getLogger(__name__)

def coordinate_median(replies: list[Message]) -> ArrayRecord:
    arrays = [m.content["arrays"] for m in replies]
    return ArrayRecord({name: Array(np.asarray(np.median(
        np.stack([a[name].numpy() for a in arrays]), axis=0)))
        for name in arrays[0]})


class ThresholdFedAvg(FedAvg):
    def __init__(self, threshold: float, arrays: ArrayRecord, limits: ReplyLimits,
                 rule: ThresholdRule, aggregation: str = "fedavg", unweighted: bool = False,
                 models: RoundModels | None = None, bound: BoundEvidence | None = None,
                 cosine_bound: BoundEvidence | None = None, **kwargs: Any) -> None:
        """``bound``, ``cosine_bound``: the pooled error-bound evidence of the verifier's
        and the cosine's labels published last (a continued run's);
        ``unweighted``: every device that replied counts once, whatever its example
        count (central DP: fl_server.privacy); ``models``: signs the description of the
        global model each message carries (fl_server.round_model; None: none, and devices
        keep nothing)."""
        super().__init__(**kwargs)
        if aggregation not in AGGREGATIONS:
            raise ValueError(f"aggregation must be one of {AGGREGATIONS}, not {aggregation!r}")
        self.threshold = threshold
        self.bound = bound or BoundEvidence.empty()
        self.cosine_bound = cosine_bound or BoundEvidence.empty()
        self.global_arrays = arrays  # what devices were sent this round
        self.limits = limits
        self.rule = rule
        self.aggregation = aggregation
        self.unweighted = unweighted
        self.models = models
        self.bytes_received: dict[int, dict[int, int]] = {}  # round -> node -> bytes
        self.verifier_bytes: dict[int, dict[int, int]] = {}  # the verifier's share of them
        self.screened: dict[int, Screened] = {}  # round -> what screening did
        self.pooled: dict[int, Pooled] = {}  # round -> how the threshold was tuned
        self.judges: dict[int, str] = {}  # round -> the judge its error-bound labels are of
        self.cosine_judges: dict[int, str] = {}  # round -> the cosine its cosine labels are of

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        self._describe(config, server_round - 1, arrays)  # the model after the last round
        if self.models is not None:  # the judges whose labels this round pools
            self.judges[server_round] = config[ROUND_JUDGE] = self.models.judge(
                server_round - 1, arrays)
            self.cosine_judges[server_round] = config[ROUND_COSINE_JUDGE] = \
                self.models.cosine_judge(server_round - 1, arrays)
        self.global_arrays = arrays
        return super().configure_train(server_round, arrays, config, grid)

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord,
                           config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._describe(config, server_round, arrays)
        return super().configure_evaluate(server_round, arrays, config, grid)

    def _describe(self, config: ConfigRecord, model_round: int, arrays: ArrayRecord) -> None:
        config["threshold"] = self.threshold
        if self.models is not None:
            config[DESCRIPTION_KEY] = self.models.describe(model_round, self.threshold, arrays,
                                                           self.bound, self.cosine_bound)

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
        self.verifier_bytes[server_round] = {
            m.metadata.src_node_id: ArrayRecord({
                name: array for name, array in m.content["arrays"].items()
                if name.startswith(VERIFIER)}).count_bytes()
            for m in replies if m.has_content() and "arrays" in m.content.array_records}
        screened = screen(replies, self.global_arrays, self.limits)
        self.screened[server_round] = screened
        self.bound = round_pool(self.bound, screened.bound, self.judges.get(server_round, ""))
        self.cosine_bound = round_pool(self.cosine_bound, screened.cosine_bound,
                                       self.cosine_judges.get(server_round, ""))
        if self.unweighted:
            for message in screened.kept:
                next(iter(message.content.metric_records.values()))[self.weighted_by_key] = 1
        useful = [m for m in screened.kept if self._weight(m) > 0]
        if not useful:
            log.warning("round %d: no device trained; the global model stays", server_round)
            return None, None
        metrics = self.train_metrics_aggr_fn([m.content for m in useful], self.weighted_by_key)
        for key in (*KEYS, *BOUND_KEYS, *COSINE_KEYS):  # the histograms are pooled, not averaged
            metrics.pop(key, None)
        if self.aggregation == "median":
            arrays = coordinate_median(useful)
        else:
            arrays, _ = super().aggregate_train(server_round, useful)
        pooled = pooled_threshold(self.threshold, sum(screened.evidence, Evidence.empty()),
                                  self.rule)
        self.pooled[server_round] = pooled
        self.threshold = metrics["threshold"] = pooled.threshold
        return arrays, metrics
