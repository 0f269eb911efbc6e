"""`meancache fl simulate`: federated rounds on Flower's simulation engine (Ray), each
client training on a partition of a labelled-pairs file, the global model scored on
held-out pairs after every round."""

import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meancache.client.fl.client_app import build_client_app
from meancache.fl_server.rounds import HISTORY, ROUND_LISTENERS
from meancache.fl_server.server_app import build_server_app

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SimulationConfig:
    pairs: Path
    checkpoint_dir: Path
    clients: int = 20
    per_round: int = 4
    rounds: int = 3
    partitioning: str = "iid"
    pairs_per_client: int = 200
    top_layers: int = 2
    epochs: int = 1
    encoder_model: str | None = None
    held_out: int = 1000
    seed: int = 0
    cpus_per_client: float = 1.0
    dp_noise_multiplier: float = 0.0
    dp_clipping_norm: float = 1.0

    def run_config(self) -> dict[str, Any]:
        config: dict[str, Any] = {
            "num-server-rounds": self.rounds,
            "min-available-nodes": self.clients,
            "min-train-nodes": self.per_round,
            "fraction-train": self.per_round / self.clients,
            "fraction-evaluate": 0.0,
            "min-evaluate-nodes": 0,
            "checkpoint-dir": str(self.checkpoint_dir),
            "top-layers": self.top_layers,
            "epochs": self.epochs,
            "data-source": "qqp",
            "qqp-path": str(self.pairs),
            "partitioning": self.partitioning,
            "pairs-per-client": self.pairs_per_client,
            "seed": self.seed,
            "cache-dir": str(self.checkpoint_dir / "partition-cache"),
            "dp-noise-multiplier": self.dp_noise_multiplier,
            "dp-clipping-norm": self.dp_clipping_norm,
        }
        if self.encoder_model:
            config["encoder-model"] = self.encoder_model
        if self.held_out:
            config |= {"held-out-path": str(self.pairs), "held-out-pairs": self.held_out}
        return config


def simulate(config: SimulationConfig, fresh: bool = True,
             on_round: Callable[[dict[str, float]], None] | None = None
             ) -> list[dict[str, float]]:
    """Run the rounds; returns one row of metrics per round (round 0 = before training)."""
    from flwr.simulation import run_simulation

    if fresh and config.checkpoint_dir.exists():
        shutil.rmtree(config.checkpoint_dir)
    history = config.checkpoint_dir / HISTORY
    run_config = config.run_config()
    if on_round is not None:  # the simulated ServerApp runs on a thread of this process
        ROUND_LISTENERS.append(on_round)
    try:
        run_simulation(
            server_app=build_server_app(run_config),
            client_app=build_client_app(run_config),
            num_supernodes=config.clients,
            backend_config={"client_resources": {"num_cpus": config.cpus_per_client,
                                                 "num_gpus": 0.0},
                            "init_args": {"log_to_driver": False}},
        )
    finally:
        if on_round is not None:
            ROUND_LISTENERS.remove(on_round)
    if not history.exists():
        return []
    return [json.loads(line) for line in history.read_text().splitlines()]
