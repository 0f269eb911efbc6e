"""The Flower ServerApp: FedAvg of the encoder's and the learned verifier's weights (one
record, the verifier's under ``verifier.``: shared.fl.weights) and of the thresholds, the
devices' error-bound evidence pooled, a versioned checkpoint after every round, and after
the last (under SecAgg+ too) an evidence round (fl_server.evidence_round) that pools the
labels scored by the final model's judges. Its settings: fl_server.run_config.ServerConfig.
"""

import logging
import random
from dataclasses import replace
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context
from flwr.serverapp import Grid, ServerApp
from meancache.fl_server.evidence_round import run_evidence_round
from meancache.fl_server.privacy import SampledClientsDP, SecureSumDP
from meancache.fl_server.round_model import RoundModels
from meancache.fl_server.rounds import HeldOut, RoundRecorder
from meancache.fl_server.run_config import ServerConfig
from meancache.fl_server.secure_rounds import run_secure_rounds
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.encoder import load_sentence_transformer, locate_model, profile_threshold
from meancache.shared.encoder.fingerprint import model_fingerprint
from meancache.shared.encoder.weights import encoder_tensors
from meancache.shared.errors import VerifierError
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.fl.checkpoint import latest_checkpoint, load_checkpoint
from meancache.shared.fl.signing import server_key
from meancache.shared.fl.weights import (
    federated_subset,
    verifier_subset,
    with_verifier,
)
from meancache.shared.pairs import read_pairs
from meancache.shared.query import embedding_text
from meancache.shared.verifier.federated import base_sha, base_tensors

log = logging.getLogger(__name__)

app = ServerApp()


def _held_out(model_dir: Path, path: Path, limit: int, seed: int) -> HeldOut:
    """The held-out pairs and the pipeline that embeds them: built only here, since the
    rounds themselves need only the weights (shared.encoder.weights)."""
    model = load_sentence_transformer(model_dir)
    pairs = read_pairs(path, split="dev")
    random.Random(seed).shuffle(pairs)
    pairs = pairs[:limit]
    return HeldOut(model, [embedding_text(p.q1) for p in pairs],  # as devices embed them
                   [embedding_text(p.q2) for p in pairs],
                   np.array([p.label for p in pairs]))


def _shipped_judge(config: ServerConfig) -> str:
    """The int8 verifier devices run before any global one ("": none readable here: the
    rounds then name no judge, and devices send no error-bound labels)."""
    try:
        return base_sha(config.model.verifier_dir)
    except VerifierError as exc:
        log.warning("no judge for the error-bound labels: %s", exc)
        return ""


@app.main()
def main(grid: Grid, context: Context) -> None:
    run_rounds(grid, ServerConfig.from_run_config(context.run_config), context)


def run_rounds(grid: Grid, config: ServerConfig, context: Context) -> None:
    model_dir = locate_model(config.model.encoder_model, config.models_dir)
    base = model_fingerprint(model_dir)
    encoder = encoder_tensors(model_dir)
    names = federated_subset(encoder, config.model.top_layers) \
        if config.model.train_encoder else []  # else the verifier alone is federated
    initial = {name: encoder[name] for name in names}
    threshold = profile_threshold(config.model.encoder_model)
    verifier_base = ""
    if config.model.verifier_layers > 0:
        verifier = base_tensors(config.model.verifier_dir)
        verifier_base = base_sha(config.model.verifier_dir)
        initial = with_verifier(initial, {name: verifier[name] for name in verifier_subset(
            verifier, config.model.verifier_layers)})
        names = list(initial)
    offset = 0
    bound = cosine_bound = BoundEvidence.empty()
    latest = latest_checkpoint(config.checkpoint_dir)
    if latest is not None:
        meta, state = load_checkpoint(latest)
        # Round numbers only grow, even from a fresh model: a device refuses a round
        # below one it has (shared.fl.freshness).
        offset = meta.round
        if (meta.base_model, meta.verifier_base) == (base, verifier_base) and set(
                state) == set(names):
            initial, threshold = state, meta.threshold
            bound = BoundEvidence.from_record(meta.bound)
            cosine_bound = BoundEvidence.from_record(meta.cosine_bound)
            log.info("continuing from the global model of round %d", meta.round)
    dp = config.dp_noise_multiplier > 0
    limits = config.limits
    if dp:  # the server clips to the DP norm itself: a device may not have
        limits = replace(limits, max_update_norm=min(limits.max_update_norm,
                                                     config.dp_clipping_norm))
    models = RoundModels(server_key(config.checkpoint_dir), base, config.model.top_layers,
                         offset, verifier_base, _shipped_judge(config))
    strategy = ThresholdFedAvg(
        threshold, ArrayRecord(initial), limits, config.threshold_rule, config.aggregation,
        unweighted=dp, models=models, bound=bound, cosine_bound=cosine_bound,
        fraction_train=config.fraction_train,
        min_train_nodes=config.min_train_nodes,
        min_available_nodes=config.min_available_nodes,
        fraction_evaluate=config.fraction_evaluate,
        min_evaluate_nodes=config.min_evaluate_nodes,
    )
    held_out = None
    if config.held_out_path is not None and config.held_out_pairs > 0:
        held_out = _held_out(model_dir, config.held_out_path, config.held_out_pairs,
                             config.model.seed)
    if config.secure_aggregation:
        run_secure_rounds(
            grid, context, list(initial), ArrayRecord(initial), threshold, limits,
            config.threshold_rule, models, config.num_server_rounds, config.round_timeout,
            {"fraction_fit": config.fraction_train, "min_fit_clients": config.min_train_nodes,
             "min_available_clients": config.min_available_nodes}, bound,
            lambda secure, spent: RoundRecorder(secure, config.checkpoint_dir, base,
                                                config.model.top_layers, offset, held_out,
                                                spent, verifier_base),
            # the devices clip to the smaller of the two norms: the noise fits that one
            (lambda secure: SecureSumDP(secure, config.dp_noise_multiplier,
                                        limits.max_update_norm, config.dp_delta))
            if dp else None, cosine_bound, config.secure_upload_mb * 1e6)
    else:
        runner: ThresholdFedAvg | SampledClientsDP = strategy
        privacy = None
        if dp:
            runner = SampledClientsDP(strategy, config.dp_noise_multiplier,
                                      config.dp_clipping_norm, config.dp_delta)
            privacy = runner.ledger.spent
        recorder = RoundRecorder(strategy, config.checkpoint_dir, base,
                                 config.model.top_layers, offset, held_out, privacy,
                                 verifier_base)
        runner.start(
            grid=grid,
            initial_arrays=ArrayRecord(initial),
            num_rounds=config.num_server_rounds,
            timeout=config.round_timeout,
            train_config=ConfigRecord({"threshold": threshold}),
            evaluate_fn=recorder,
        )
    # under SecAgg+ too: its replies hold only the error-bound sums, which every secure
    # round already sends in the clear (fl_server.evidence_round)
    if config.evidence_round:
        run_evidence_round(grid, config.checkpoint_dir, models, limits, config.round_timeout)
