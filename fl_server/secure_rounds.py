"""Rounds under secure aggregation (run config ``secure-aggregation = 1``): Flower's
SecAgg+ (``SecAggPlusWorkflow``), so that the server learns only the weighted sum of the
devices' weights, never one device's.

Flower 1.42 runs SecAgg+ only inside its legacy workflow (``DefaultWorkflow`` over a
``LegacyContext`` and a legacy ``Strategy``): the workflow raises TypeError for any other
context, so this mode runs beside the Message-API rounds (fl_server.server_app), not in
them. What it keeps and loses of the defences (docs/federated-learning.md):

- kept, on the device: the update's L2 norm clipped to ``max-update-norm`` (the server
  sends it as ``clipping_norm``; client.fl.client_app's clipping mod), and the example
  count clamped to ``max-examples`` before it weighs the masked sum;
- kept, on the server: the similarity evidence (counts, sent in the clear as before) is
  screened, bounded and pooled for the threshold as in plain rounds, and so is the
  error-bound evidence (shared.fl.bound_evidence: sums per score bin, also in the clear,
  checked for sums no labels could make and capped at ``max-examples`` labels a device;
  the round's median cap is kept too, as every device's evidence is seen; the verifier's
  labels and the cosine's alike), and after the last round the evidence round
  (fl_server.evidence_round, run by fl_server.server_app after these rounds) rescores it
  with the final model's judges, so its pools name them as in plain runs: its replies
  hold the same sums in the clear and no weights, so it reveals nothing a secure round
  does not;
- central DP (``dp-noise-multiplier`` > 0) as client-side clipping only
  (fl_server.privacy.SecureSumDP): each device clips its update to the DP clipping norm
  and weighs 1 (``max-examples`` 1 is sent, and SecAgg+'s ``max_weight`` is 1), and the
  server adds the Gaussian noise to the unmasked mean; epsilon is reported as in plain
  rounds;
- lost: screening of individual updates (a malformed or non-finite update, the median,
  the round's median count cap), the server's own clipping under DP (it cannot see an
  update to clip it), and the quantised updates: SecAgg+ masks full weights as integers
  in [0, 2^22) on a 32-bit ring, each sent as an int64.

So that a device sends at most ``secure-upload-mb`` a round, a large tensor's entries are
sent only in part where the whole would not fit: the same entries on every device, drawn
afresh each round (shared.fl.secure.sketch_entries), and the server keeps the global value
everywhere else. The sum stays exact where entries were sent; a device keeps what it did
not send for its next round (client.fl.secure: error feedback), and
docs/federated-learning.md measures what the cap costs. Under DP the noise goes on every
entry, sent or not.

Legacy parameters are lists without names, and legacy metrics hold only scalars: the
tensors' names travel in the fit config in a fixed order, and the evidence histograms as
JSON text (client.fl.secure decodes and encodes them).
"""

import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, Context, Message
from flwr.common import (
    FitIns,
    FitRes,
    Parameters,
    Scalar,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server import ServerConfig as LegacyServerConfig
from flwr.server.client_proxy import ClientProxy
from flwr.server.compat import LegacyContext
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.server.workflow import DefaultWorkflow, SecAggPlusWorkflow
from flwr.serverapp import Grid
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from meancache.fl_server.pooled_threshold import Pooled, ThresholdRule, pooled_threshold
from meancache.fl_server.privacy import SecureSumDP
from meancache.fl_server.round_model import RoundModels
from meancache.fl_server.screening import ReplyLimits, Screened, cap_labels
from meancache.shared.errors import RunConfigError
from meancache.shared.fl.bound_evidence import (
    COSINE_KEYS,
    ROUND_COSINE_JUDGE,
    ROUND_JUDGE,
    BoundEvidence,
    round_pool,
)
from meancache.shared.fl.checkpoint import DESCRIPTION_KEY
from meancache.shared.fl.evidence import Evidence
from meancache.shared.fl.secure import (
    NAMES,
    SECURE,
    SKETCH_SEED,
    SKETCH_SHARE,
    from_scalars,
    sketch_entries,
    sketch_share,
)

log = logging.getLogger(__name__)

Spent = Callable[[], dict[str, float]]  # the privacy spent so far (PrivacyLedger.spent)

# SecAgg+'s dropout tolerance: each device's key is shared with every device sampled in
# the round, and two thirds of those shares rebuild it.
SHARES = 1.0
RECONSTRUCTION = 2 / 3


def message_bytes(message: Message) -> int:
    """A reply's bytes as Flower serialises it for the wire (its records' own
    ``count_bytes`` cannot count the list values SecAgg+'s records hold)."""
    return sum(len(part.deflate()) for part in get_all_nested_objects(message).values())


class CountingGrid:
    """The grid, counting the bytes of every reply a node sends (all four SecAgg+
    stages: keys, shares, masked vectors, unmasking)."""

    def __init__(self, grid: Grid) -> None:
        self._grid = grid
        self.received: dict[int, int] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._grid, name)

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None
                         ) -> Iterable[Message]:
        replies = list(self._grid.send_and_receive(messages, timeout=timeout))
        for reply in replies:
            if reply.has_content():
                node = reply.metadata.src_node_id
                self.received[node] = self.received.get(node, 0) + message_bytes(reply)
        return replies

    def take(self) -> dict[int, int]:
        """The bytes counted since the last call, by node."""
        received, self.received = self.received, {}
        return received


class SecureFedAvg(LegacyFedAvg):
    """The legacy strategy SecAgg+ needs: it sends the global weights, their signed
    description (fl_server.round_model, as the Message-API rounds do), the threshold and
    the device-side bounds, and is handed the already summed weights (each device's
    FitRes with the aggregate in place of its own parameters)."""

    def __init__(self, names: list[str], initial: ArrayRecord, threshold: float,
                 limits: ReplyLimits, rule: ThresholdRule, models: RoundModels,
                 grid: CountingGrid, recorder: Callable[[int, ArrayRecord], object],
                 bound: BoundEvidence | None = None, max_weight: int | None = None,
                 cosine_bound: BoundEvidence | None = None, upload_bytes: float = 0,
                 **kwargs: Any) -> None:
        self.names = names
        # the share of each large tensor's entries a device sends (1.0: all of them)
        try:
            self.share = sketch_share([initial[n].numpy().size for n in names], upload_bytes)
        except ValueError as exc:
            raise RunConfigError(f"run config 'secure-upload-mb': {exc}") from None
        # a device's weight in the masked sum (its count, clamped on the device): 1 under
        # DP, where every device counts once; the evidence is still capped by limits
        self.max_weight = limits.max_examples if max_weight is None else max_weight
        self.bound = bound or BoundEvidence.empty()
        self.cosine_bound = cosine_bound or BoundEvidence.empty()
        self.models = models
        self.threshold = threshold
        self.limits = limits
        self.rule = rule
        self.grid = grid
        self.recorder = recorder
        self.bytes_received: dict[int, dict[int, int]] = {}
        self.verifier_bytes: dict[int, dict[int, int]] = {}  # not told apart once masked
        self.screened: dict[int, Screened] = {}  # nothing is screened: the updates are hidden
        self.pooled: dict[int, Pooled] = {}
        self.judges: dict[int, str] = {}  # round -> the judge its error-bound labels are of
        self.cosine_judges: dict[int, str] = {}  # round -> the cosine its cosine labels are of
        # the global weights configure_fit sends, which _fit_config describes
        self.sent = ndarrays_to_parameters([initial[n].numpy() for n in names])
        super().__init__(
            initial_parameters=self.sent,
            on_fit_config_fn=self._fit_config, evaluate_fn=self._evaluate,
            fraction_evaluate=0.0, min_evaluate_clients=0, accept_failures=True, **kwargs)

    def configure_fit(self, server_round: int, parameters: Parameters,
                      client_manager: Any) -> list[tuple[ClientProxy, FitIns]]:
        self.sent = parameters
        return super().configure_fit(server_round, parameters, client_manager)

    def _fit_config(self, server_round: int) -> dict[str, Scalar]:
        sent = ArrayRecord({n: Array(a) for n, a in zip(
            self.names, parameters_to_ndarrays(self.sent), strict=True)})
        description = self.models.describe(server_round - 1, self.threshold, sent,
                                           self.bound, self.cosine_bound)
        self.judges[server_round] = judge = self.models.judge(server_round - 1, sent)
        self.cosine_judges[server_round] = cosine = self.models.cosine_judge(
            server_round - 1, sent)
        return {"threshold": self.threshold, SECURE: 1, ROUND_JUDGE: judge,
                ROUND_COSINE_JUDGE: cosine, DESCRIPTION_KEY: description,
                NAMES: "\n".join(self.names), "clipping_norm": self.limits.max_update_norm,
                "max-examples": self.max_weight, SKETCH_SHARE: self.share,
                SKETCH_SEED: server_round}

    def aggregate_fit(self, server_round: int,
                      results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        self.bytes_received[server_round] = self.grid.take()
        if not results:
            return None, {}
        evidence = Evidence.empty()
        labels: list[BoundEvidence] = []
        cosine: list[BoundEvidence] = []
        for _, res in results:
            try:
                metrics = from_scalars(dict(res.metrics))
                claimed = Evidence.from_metrics(metrics)
                verifier_labels = BoundEvidence.from_metrics(metrics)
                cosine_labels = BoundEvidence.from_metrics(metrics, COSINE_KEYS)
            except ValueError as exc:
                log.warning("round %d: ignored a device's evidence: %s", server_round, exc)
                continue
            evidence = evidence + claimed.at_most(self.limits.max_examples)
            labels.append(verifier_labels)
            cosine.append(cosine_labels)
        self.bound = round_pool(self.bound, cap_labels(labels, self.limits.max_examples)[0],
                                self.judges.get(server_round, ""))
        self.cosine_bound = round_pool(
            self.cosine_bound, cap_labels(cosine, self.limits.max_examples)[0],
            self.cosine_judges.get(server_round, ""))
        pooled = pooled_threshold(self.threshold, evidence, self.rule)
        self.pooled[server_round] = pooled
        self.threshold = pooled.threshold
        return self._whole(server_round, results[0][1].parameters), {
            "threshold": pooled.threshold}

    def _whole(self, server_round: int, mean: Parameters) -> Parameters:
        """The global weights with the round's mean in place where it was sent."""
        if self.share >= 1:
            return mean
        sent, out = parameters_to_ndarrays(mean), []
        for i, weights in enumerate(parameters_to_ndarrays(self.sent)):
            entries = sketch_entries(weights.size, self.share, server_round, self.names[i])
            if entries is None:
                out.append(sent[i])
                continue
            whole = weights.copy()
            whole.reshape(-1)[entries] = sent[i]
            out.append(whole)
        return ndarrays_to_parameters(out)

    def _evaluate(self, server_round: int, ndarrays: list[Any], config: dict[str, Scalar]
                  ) -> tuple[float, dict[str, Scalar]] | None:
        arrays = ArrayRecord({n: Array(np.asarray(a)) for n, a in zip(self.names, ndarrays,
                                                                        strict=True)})
        self.recorder(server_round, arrays)
        return None


def run_secure_rounds(grid: Grid, context: Context, names: list[str], initial: ArrayRecord,
                      threshold: float, limits: ReplyLimits, rule: ThresholdRule,
                      models: RoundModels, rounds: int, timeout: float,
                      sampling: dict[str, Any], bound: BoundEvidence | None,
                      recorder_for: Callable[[SecureFedAvg, Spent | None],
                                             Callable[[int, ArrayRecord], object]],
                      dp: Callable[[SecureFedAvg], SecureSumDP] | None = None,
                      cosine_bound: BoundEvidence | None = None,
                      upload_bytes: float = 0) -> None:
    """``rounds`` rounds of FedAvg under SecAgg+, with DP's noise on the sum when ``dp``
    wraps the strategy (fl_server.privacy.SecureSumDP); ``recorder_for`` makes the
    checkpointing callback (fl_server.rounds.RoundRecorder) of the strategy, given the
    privacy spent so far under DP; ``bound``, ``cosine_bound``: the pools published last;
    ``upload_bytes``: the cap on a device's masked weights a round (0: none)."""
    counting = CountingGrid(grid)
    strategy = SecureFedAvg(names, initial, threshold, limits, rule, models, counting,
                            lambda r, a: None, bound, 1 if dp else None,
                            cosine_bound=cosine_bound, upload_bytes=upload_bytes, **sampling)
    noised = dp(strategy) if dp is not None else None
    runner: LegacyStrategy = noised or strategy
    strategy.recorder = recorder_for(strategy, noised.ledger.spent if noised else None)
    legacy = LegacyContext(context, config=LegacyServerConfig(num_rounds=rounds,
                                                              round_timeout=timeout),
                           strategy=runner)
    workflow = DefaultWorkflow(fit_workflow=SecAggPlusWorkflow(
        num_shares=SHARES, reconstruction_threshold=RECONSTRUCTION,
        max_weight=float(strategy.max_weight), timeout=timeout))
    started = time.time()
    workflow(counting, legacy)  # type: ignore[arg-type]
    log.info("%d secure rounds in %.1f s", rounds, time.time() - started)

