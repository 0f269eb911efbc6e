"""The Flower ServerApp: FedAvg of the encoder's weights and of the thresholds, a
versioned checkpoint after every round.

Run config (all optional): num-server-rounds, threshold-init, fraction-train,
min-train-nodes, min-available-nodes, fraction-evaluate, min-evaluate-nodes,
round-timeout, checkpoint-dir, encoder-model, top-layers, dp-noise-multiplier,
dp-clipping-norm, held-out-path and held-out-pairs (server-side scoring, simulation only).
"""

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.strategy import DifferentialPrivacyClientSideFixedClipping
from meancache.fl_server.rounds import HeldOut, RoundRecorder
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.encoder import locate_model
from meancache.shared.encoder.fingerprint import model_fingerprint
from meancache.shared.fl.checkpoint import latest_checkpoint, load_checkpoint
from meancache.shared.fl.weights import federated_names, federated_state
from meancache.shared.pairs import read_pairs
from meancache.shared.threshold import DEFAULT_THRESHOLD
from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

def default_checkpoint_dir() -> Path:
    """Under the meancache data dir of the process that started the SuperLink."""
    from meancache.client.config import load_settings

    return load_settings().data_dir / "fl-server" / "checkpoints"


def _held_out(model: SentenceTransformer, path: str, limit: int, seed: int) -> HeldOut:
    pairs = read_pairs(Path(path), split="dev")
    random.Random(seed).shuffle(pairs)
    pairs = pairs[:limit]
    return HeldOut(model, [p.q1 for p in pairs], [p.q2 for p in pairs],
                   np.array([p.label for p in pairs]))


def build_server_app(defaults: dict[str, Any] | None = None) -> ServerApp:
    """A ServerApp whose run config is ``defaults`` overridden by the run's own."""
    server_app = ServerApp()

    @server_app.main()
    def main(grid: Grid, context: Context) -> None:
        run_rounds(grid, {**(defaults or {}), **dict(context.run_config)})

    return server_app


def run_rounds(grid: Grid, config: dict[str, Any]) -> None:
    encoder_model = str(config.get("encoder-model") or "") or None
    top_layers = int(config.get("top-layers", 0))
    checkpoint_dir = Path(str(config.get("checkpoint-dir") or default_checkpoint_dir()))
    model_dir = locate_model(encoder_model)
    model = SentenceTransformer(str(model_dir), device="cpu", local_files_only=True)
    base = model_fingerprint(model_dir)
    names = federated_names(model, top_layers)
    initial = federated_state(model, names)
    threshold = float(config.get("threshold-init", DEFAULT_THRESHOLD))
    offset = 0
    latest = latest_checkpoint(checkpoint_dir)
    if latest is not None:
        meta, state = load_checkpoint(latest)
        if meta.base_model == base and set(state) == set(names):
            initial, threshold, offset = state, meta.threshold, meta.round
            log.info("continuing from the global model of round %d", meta.round)
    strategy = ThresholdFedAvg(
        threshold,
        fraction_train=float(config.get("fraction-train", 1.0)),
        min_train_nodes=int(config.get("min-train-nodes", 2)),
        min_available_nodes=int(config.get("min-available-nodes", 2)),
        fraction_evaluate=float(config.get("fraction-evaluate", 1.0)),
        min_evaluate_nodes=int(config.get("min-evaluate-nodes", 1)),
    )
    held_out = None
    if config.get("held-out-path"):
        held_out = _held_out(model, str(config["held-out-path"]),
                             int(config.get("held-out-pairs", 1000)), int(config.get("seed", 0)))
    recorder = RoundRecorder(strategy, checkpoint_dir, base, top_layers, offset, held_out)
    runner: Any = strategy
    noise = float(config.get("dp-noise-multiplier", 0.0))
    if noise > 0:
        runner = DifferentialPrivacyClientSideFixedClipping(
            strategy, noise_multiplier=noise,
            clipping_norm=float(config.get("dp-clipping-norm", 1.0)),
            num_sampled_clients=int(config.get("min-train-nodes", 2)),
        )
    runner.start(
        grid=grid,
        initial_arrays=ArrayRecord(initial),
        num_rounds=int(config.get("num-server-rounds", 3)),
        timeout=float(config.get("round-timeout", 600.0)),
        train_config=ConfigRecord({"threshold": threshold}),
        evaluate_fn=recorder,
    )


app = build_server_app()
