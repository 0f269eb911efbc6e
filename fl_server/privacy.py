"""Central differential privacy that means what it says. With DP on:

- aggregation is unweighted (every sampled device counts once, as Flower's DP wrappers
  assume: a weight of 10^12 examples would be a sensitivity of 10^12);
- each update is clipped to the DP clipping norm on the server too (a device need not
  run ``fixedclipping_mod`` honestly);
- the Gaussian noise is calibrated to the devices whose updates were actually averaged
  this round (not to a configured minimum);
- the privacy spent is accounted with Opacus's RDP accountant (no sampling amplification
  is claimed: the server cannot vouch for how devices were sampled) and reported as
  epsilon at the run's ``dp-delta`` after every round, in history.jsonl and in each
  checkpoint's metadata.

Under SecAgg+ (fl_server.secure_rounds) the server sees only the sum, so it can neither
clip nor screen one update: Flower's client-side fixed clipping is then all there is
(``SecureSumDP``). Each device clips its own update to the DP clipping norm (the
ClientApp's ``fixedclipping_mod``) and weighs 1 in the masked sum; the server adds the
Gaussian noise to the unmasked mean only, calibrated and accounted as above. What is
lost against plain DP rounds: the server's own clipping (a device that does not clip, or
masks another weight than it reports, is not caught) and every screening of updates.
"""

import logging
from collections.abc import Iterable
from typing import Any

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.common import FitRes, Parameters, Scalar
from flwr.server.client_proxy import ClientProxy
from flwr.server.strategy import (
    DifferentialPrivacyClientSideFixedClipping as LegacyClientSideFixedClipping,
)
from flwr.server.strategy import Strategy as LegacyStrategy
from flwr.serverapp import Grid
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping
from flwr.supercore.differential_privacy import KEY_CLIPPING_NORM, add_gaussian_noise_to_params
from meancache.fl_server.strategy import ThresholdFedAvg

log = logging.getLogger(__name__)


class PrivacyLedger:
    """Epsilon at ``delta`` after the Gaussian releases so far (one per round)."""

    def __init__(self, noise_multiplier: float, delta: float) -> None:
        self.noise_multiplier = noise_multiplier
        self.delta = delta
        # imported here: Opacus pulls in torch.distributed and more (about 2 CPU-s), which a
        # ServerApp without DP never needs
        from opacus.accountants import RDPAccountant

        self.accountant = RDPAccountant()

    def release(self) -> None:
        self.accountant.step(noise_multiplier=self.noise_multiplier, sample_rate=1.0)

    @property
    def releases(self) -> int:
        return sum(steps for _, _, steps in self.accountant.history)

    def spent(self) -> dict[str, float]:
        epsilon = self.accountant.get_epsilon(self.delta) if self.releases else 0.0
        return {"epsilon": float(epsilon), "delta": self.delta,
                "dp_releases": float(self.releases)}


class SampledClientsDP(DifferentialPrivacyClientSideFixedClipping):
    """Flower's client-side fixed-clipping DP around a ThresholdFedAvg, with the noise
    calibrated to the devices actually averaged and the privacy spent accounted."""

    def __init__(self, strategy: ThresholdFedAvg, noise_multiplier: float,
                 clipping_norm: float, delta: float) -> None:
        super().__init__(strategy, noise_multiplier=noise_multiplier,
                         clipping_norm=clipping_norm, num_sampled_clients=1)
        self.inner = strategy
        self.ledger = PrivacyLedger(noise_multiplier, delta)

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord,
                        grid: Grid) -> Iterable[Message]:
        config[KEY_CLIPPING_NORM] = self.clipping_norm
        return self.inner.configure_train(server_round, arrays, config, grid)

    def aggregate_train(self, server_round: int, replies: Iterable[Message]
                        ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        arrays, metrics = self.inner.aggregate_train(server_round, replies)
        if arrays is None:
            return None, metrics
        averaged = len(self.inner.screened[server_round].kept)
        self.num_sampled_clients = averaged
        arrays = self._add_noise_to_aggregated_arrays(arrays)
        self.ledger.release()
        log.info("round %d: DP noise for %d devices; %s", server_round, averaged,
                 self.ledger.spent())
        return arrays, metrics


class SecureSumDP(LegacyClientSideFixedClipping):
    """Flower's (legacy, as SecAgg+ needs) client-side fixed-clipping DP around
    fl_server.secure_rounds.SecureFedAvg: the devices clip (it sends ``clipping_norm``),
    the noise goes on the unmasked mean, calibrated to the devices in the sum (those
    that reported a weight), and the privacy spent is accounted. A round with a failed
    device still counts the others (Flower's wrapper would drop the whole round)."""

    def __init__(self, strategy: LegacyStrategy, noise_multiplier: float,
                 clipping_norm: float, delta: float) -> None:
        super().__init__(strategy, noise_multiplier=noise_multiplier,
                         clipping_norm=clipping_norm, num_sampled_clients=1)
        self.ledger = PrivacyLedger(noise_multiplier, delta)

    def aggregate_fit(self, server_round: int, results: list[tuple[ClientProxy, FitRes]],
                      failures: list[Any]) -> tuple[Parameters | None, dict[str, Scalar]]:
        summed = sum(1 for _, res in results if res.num_examples > 0)
        parameters, metrics = self.strategy.aggregate_fit(server_round, results, failures)
        if parameters is None or summed == 0:
            return None, metrics
        self.num_sampled_clients = summed
        parameters = add_gaussian_noise_to_params(parameters, self.noise_multiplier,
                                                  self.clipping_norm, summed)
        self.ledger.release()
        log.info("round %d: DP noise on the secure sum of %d devices; %s", server_round,
                 summed, self.ledger.spent())
        return parameters, metrics
