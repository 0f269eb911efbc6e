"""Secure aggregation: Flower's SecAgg+ in the simulation (its fewest devices, one round),
whose global model is the plain FedAvg of the same devices' training within SecAgg+'s own
quantisation, and whose pools the evidence round after it names by that model's judges;
with central DP, the noised mean of the updates each device clipped, and its epsilon
reported; and the run-config combinations it cannot serve refused by name."""

from pathlib import Path

import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict
from meancache.client.fl.client_app import app as client_app
from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.run_config import ServerConfig
from meancache.fl_server.simulate import SimulationConfig, simulate
from meancache.shared.encoder import Encoder
from meancache.shared.errors import RunConfigError
from meancache.shared.fl.bound_evidence import BoundEvidence, cosine_judge
from meancache.shared.fl.checkpoint import latest_checkpoint, load_checkpoint
from meancache.shared.fl.secure import MASKED_BYTES, sketch_entries, sketch_share
from meancache.shared.fl.signing import PUBLIC_KEY, read_public_key, verify
from meancache.shared.fl.weights import federated_names, federated_state
from sentence_transformers import SentenceTransformer

from tests.support.fl import gaussian_rdp_epsilon, message
from tests.support.paths import DATA_DIR
from tests.support.tiny_encoder import make_tiny_encoder

PAIRS_PER_CLIENT = 30
TRAINED = int(PAIRS_PER_CLIENT * 0.8)  # each device's example count (client.fl.data.split)
MAX_EXAMPLES = 1000  # the app's max-examples: SecAgg+'s max_weight
DEVICES = 2  # the fewest SecAgg+ runs with (Flower's SecAggPlusWorkflow)


def _plain_fedavg(config: SimulationConfig, tiny_dir: Path
                  ) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]], int]:
    """The plain FedAvg of the round: each simulated device's training, through the real
    ClientApp in this process with the run config the simulation submits, averaged by
    example count. Also each device's update, and the bytes of one float32 reply."""
    run_config = {**default_run_config(), **config.full_run_config()}
    model = SentenceTransformer(str(tiny_dir), device="cpu")
    initial = federated_state(model, federated_names(model, 1))
    request = message(RecordDict({"arrays": ArrayRecord(initial),
                                  "config": ConfigRecord({"threshold": 0.8})}))
    trained, counts, updates = [], [], []
    for node in range(DEVICES):
        context = Context(run_id=1, node_id=node + 1, state=RecordDict(),
                          node_config={"partition-id": node, "num-partitions": DEVICES},
                          run_config=run_config)
        reply = client_app(request, context)
        assert not reply.has_error(), reply.error if reply.has_error() else ""
        sent = reply.content["arrays"]
        reply_bytes = sent.count_bytes()
        state = sent.to_torch_state_dict()
        trained.append(state)
        counts.append(int(reply.content["metrics"]["num-examples"]))
        updates.append({k: state[k] - initial[k] for k in initial})
    assert counts == [TRAINED] * DEVICES
    mean = {k: sum(c * s[k] for c, s in zip(counts, trained, strict=True)) / sum(counts)
            for k in initial}
    return mean, updates, reply_bytes


CAP_MB = 0.06  # under the tiny top layer's 9,600 masked weights (0.077 MB), over its
# 5,504 entries of small tensors (0.044 MB)


@pytest.mark.slow(35)
def test_secure_aggregation_learns_the_plain_fedavg_of_the_entries_under_the_upload_cap(
    tmp_path: Path, tiny_dir: Path
) -> None:
    """Each device sends the round's shared entries of each large tensor (and the small
    tensors whole) within the cap; the global model is the plain FedAvg there, within
    SecAgg+'s quantisation, and the global weights it was sent everywhere else. (One
    simulation: each costs about 45 CPU-s; the uncapped sum is the DP test's below.)"""
    config = SimulationConfig(
        pairs=DATA_DIR / "qqp" / "pairs.jsonl", checkpoint_dir=tmp_path / "secure",
        clients=DEVICES, per_round=DEVICES, workers=1, run_config={
            "num-server-rounds": 1, "pairs-per-client": PAIRS_PER_CLIENT, "top-layers": 1,
            "encoder-model": str(tiny_dir), "held-out-pairs": 0, "verifier-top-layers": 0,
            "update-bits": 0, "secure-aggregation": 1, "secure-upload-mb": CAP_MB})
    secure = simulate(config, tmp_path / "flwr-home")
    latest = latest_checkpoint(tmp_path / "secure")
    assert latest is not None
    meta, hidden = load_checkpoint(latest)
    verify(meta, read_public_key(str(tmp_path / "secure" / PUBLIC_KEY)))
    seen, updates, plain_bytes = _plain_fedavg(config, tiny_dir)
    # No update reaches the clipping norm, so clipping on the device changes nothing.
    norm = float(default_run_config()["max-update-norm"])
    assert all(sum(float(d.square().sum()) for d in u.values()) ** 0.5 < norm
               for u in updates)
    model = SentenceTransformer(str(tiny_dir), device="cpu")
    initial = federated_state(model, federated_names(model, 1))
    names = list(initial)
    assert set(hidden) == set(names)
    share = sketch_share([initial[n].numel() for n in names], CAP_MB * 1e6)
    assert 0 < share < 1
    # Each device's weights, scaled by its count / max_weight, are rounded stochastically
    # to a step of 2 * 8 / 2**22 (SecAgg+'s clipping range and quantisation range), an
    # error under one step; the sum is divided by the scales' sum, so the mean is within
    # one step / (count / max_weight) of the float one. The simulation's devices train
    # apart from this process's, which adds their own float noise (about 1e-5 here): the
    # largest difference is held to twice the bound, the mean to half of it (a sum of two
    # roundings averages well under a step).
    bound = 16 / 2**22 * MAX_EXAMPLES / TRAINED
    sent_entries, differences = 0, []
    for name in names:
        entries = sketch_entries(initial[name].numel(), share, 1, name)  # round 1's
        got, start = hidden[name].float().flatten(), initial[name].flatten()
        mean = seen[name].flatten()
        sent = torch.zeros(got.numel(), dtype=torch.bool)
        sent[torch.as_tensor(entries if entries is not None else range(got.numel()))] = True
        sent_entries += int(sent.sum())
        assert torch.equal(got[~sent], start[~sent]), name  # not sent: the weights sent
        difference = (got[sent] - mean[sent]).abs()
        assert float(difference.max()) <= 2 * bound, name
        differences.append(difference)
    assert float(torch.cat(differences).mean()) <= bound / 2
    assert any(not torch.equal(hidden[n], v) for n, v in seen.items())  # masked, rounded
    assert sent_entries * MASKED_BYTES <= CAP_MB * 1e6
    assert sent_entries < sum(initial[n].numel() for n in names)
    # every stage's replies are counted: more than the masked entries alone
    assert secure[1]["bytes_per_client"] > sent_entries * MASKED_BYTES
    # the cosine's labels (each device's validation pairs, scored by the global encoder)
    # were not masked: the round pooled them as in plain rounds; then the evidence round
    # after it (fl_server.evidence_round, outside the secure sum: label sums, no weights)
    # had both devices score the same pairs in the final model's space, so the pool
    # signed with that model names its own cosine, not the base model's the round was
    # sent; no verifier, so no verifier labels
    validation = DEVICES * (PAIRS_PER_CLIENT - TRAINED)
    assert secure[1]["cosine_bound_labels"] == validation
    assert meta.metrics["evidence_round_replies"] == DEVICES
    assert meta.metrics["evidence_round_rejected"] == 0
    assert meta.metrics["evidence_round_bytes_received"] > 0
    cosine = BoundEvidence.from_record(meta.cosine_bound)
    final = cosine_judge(Encoder.load(tiny_dir, backend="torch", global_weights=latest).version)
    assert (cosine.labels, cosine.judge) == (validation, final)
    assert final != cosine_judge(Encoder.load(tiny_dir, backend="torch").version)
    assert BoundEvidence.from_record(meta.bound).labels == 0
    print(f"share {share:.3f}: {sent_entries} entries sent; bytes per client per round: "
          f"plain float32 {plain_bytes}, SecAgg+ {secure[1]['bytes_per_client']:.0f} in "
          f"all four stages; evidence round {meta.metrics['evidence_round_seconds']:.1f} s, "
          f"{meta.metrics['evidence_round_bytes_sent']:.0f} bytes sent, "
          f"{meta.metrics['evidence_round_bytes_received']:.0f} received")


CLIP = 1e-3  # the DP clipping norm: about a third of each device's update here
NOISE = 0.2  # the noise multiplier: sigma = NOISE * CLIP / DEVICES = 1e-4 a coordinate


@pytest.mark.slow(35)
def test_secure_aggregation_with_dp_noises_the_sum_of_the_updates_each_device_clipped(
    tmp_path: Path
) -> None:
    # without dropout, this process redoes each simulated device's training exactly
    tiny_dir = make_tiny_encoder(tmp_path / "tiny", dropout=0.0)
    config = SimulationConfig(
        pairs=DATA_DIR / "qqp" / "pairs.jsonl", checkpoint_dir=tmp_path / "secure",
        clients=DEVICES, per_round=DEVICES, workers=1, run_config={
            "num-server-rounds": 1, "pairs-per-client": PAIRS_PER_CLIENT, "top-layers": 1,
            "encoder-model": str(tiny_dir), "held-out-pairs": 0, "verifier-top-layers": 0,
            "update-bits": 0, "secure-aggregation": 1, "dp-noise-multiplier": NOISE,
            "dp-clipping-norm": CLIP, "dp-delta": 1e-5})
    secure = simulate(config, tmp_path / "flwr-home")
    latest = latest_checkpoint(tmp_path / "secure")
    assert latest is not None
    meta, hidden = load_checkpoint(latest)
    verify(meta, read_public_key(str(tmp_path / "secure" / PUBLIC_KEY)))
    _, updates, _ = _plain_fedavg(config, tiny_dir)  # as trained, before any clipping
    model = SentenceTransformer(str(tiny_dir), device="cpu")
    initial = federated_state(model, federated_names(model, 1))
    norms = [sum(float(d.square().sum()) for d in u.values()) ** 0.5 for u in updates]
    assert all(n > 2 * CLIP for n in norms), norms  # every device's update is clipped
    flat = [torch.cat([u[k].flatten() for k in sorted(initial)]) for u in updates]
    clipped = sum(f * min(1.0, CLIP / n) for f, n in zip(flat, norms, strict=True)) / DEVICES
    unclipped = sum(flat) / DEVICES
    learned = torch.cat([(hidden[k].float() - initial[k]).flatten() for k in sorted(initial)])
    residual = learned - clipped
    sigma = NOISE * CLIP / DEVICES
    # Noise was added: what the round learned is the clipped mean plus N(0, sigma^2) in
    # each of the 9,600 values (the std of 9,600 draws is within 3% of sigma with
    # probability 1 - 1e-5; SecAgg+'s rounding, 16 / 2**22 at weight 1, is far below
    # sigma and adds in quadrature).
    std = float(residual.std())
    assert 0.9 * sigma < std < 1.1 * sigma, (std, sigma)
    # ... and it was added to the sum of clipped updates: along the direction in which
    # clipping moves the mean, the round sits where the clipped mean is (one draw of the
    # noise, |z| < 5 sigma), not where the unclipped one is (16 sigma away here).
    away = unclipped - clipped
    direction = away / away.norm()
    assert float(away.norm()) > 10 * sigma
    assert abs(float(residual @ direction)) < 5 * sigma
    # epsilon is reported after the round, as for plain DP rounds
    assert secure[1]["epsilon"] == pytest.approx(gaussian_rdp_epsilon(NOISE, 1, 1e-5))
    assert secure[1]["dp_releases"] == 1 and secure[0]["epsilon"] == 0.0
    assert meta.metrics["epsilon"] == secure[1]["epsilon"]
    print(f"update norms {norms}, clip {CLIP}; residual std {std:.3g} against sigma "
          f"{sigma:.3g}; along the clipping {float(residual @ direction):.3g} (unclipped "
          f"{float(away.norm()):.3g}); epsilon {secure[1]['epsilon']:.1f}")


@pytest.mark.parametrize(("extra", "message"), [
    ({"aggregation": "median"}, "needs 'aggregation' = 'fedavg'"),
    ({"secure-aggregation": 2}, "'secure-aggregation' must be 0 or 1"),
    ({"dp-noise-multiplier": 1.0, "dp-clipping-norm": 0.0}, "must be > 0 with central DP"),
])
def test_what_secure_aggregation_cannot_serve_is_refused_by_name(
    extra: dict[str, object], message: str
) -> None:
    config = {**default_run_config(), "checkpoint-dir": "/tmp/ckpt", "secure-aggregation": 1,
              **extra}
    with pytest.raises(RunConfigError, match=message):
        ServerConfig.from_run_config(config)


def test_central_dp_runs_beside_secure_aggregation() -> None:
    """Client-side clipping and the noise on the sum: no longer refused."""
    config = ServerConfig.from_run_config({
        **default_run_config(), "checkpoint-dir": "/tmp/ckpt", "secure-aggregation": 1,
        "dp-noise-multiplier": 1.0})
    assert config.secure_aggregation and config.dp_noise_multiplier == 1.0
