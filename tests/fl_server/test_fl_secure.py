"""Secure aggregation: Flower's SecAgg+ in the simulation, whose global model is the
plain FedAvg's within SecAgg+'s own quantisation, and the run-config combinations it
cannot serve refused by name."""

from pathlib import Path

import pytest
import torch
from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.run_config import ServerConfig
from meancache.fl_server.simulate import SimulationConfig, simulate
from meancache.shared.errors import RunConfigError
from meancache.shared.fl.checkpoint import latest_checkpoint, load_checkpoint
from meancache.shared.fl.signing import PUBLIC_KEY, read_public_key, verify

from tests.support.paths import DATA_DIR

PAIRS_PER_CLIENT = 30
TRAINED = int(PAIRS_PER_CLIENT * 0.8)  # each device's example count (client.fl.data.split)
MAX_EXAMPLES = 1000  # the app's max-examples: SecAgg+'s max_weight


def test_secure_aggregation_learns_the_plain_fedavg_within_its_quantisation(
    tmp_path: Path, tiny_dir: Path
) -> None:
    common = {"num-server-rounds": 1, "pairs-per-client": PAIRS_PER_CLIENT,
              "top-layers": 1, "encoder-model": str(tiny_dir), "held-out-pairs": 0,
              "verifier-top-layers": 0, "update-bits": 0}

    def run(name: str, secure: int) -> list[dict[str, float]]:
        return simulate(SimulationConfig(
            pairs=DATA_DIR / "qqp" / "pairs.jsonl", checkpoint_dir=tmp_path / name,
            clients=3, per_round=3, run_config={**common, "secure-aggregation": secure}),
            tmp_path / "flwr-home")

    plain, secure = run("plain", 0), run("secure", 1)
    assert plain[1]["clipped_updates"] == 0  # so clipping on the device changes nothing
    latest = latest_checkpoint(tmp_path / "secure")
    assert latest is not None
    meta, hidden = load_checkpoint(latest)
    verify(meta, read_public_key(str(tmp_path / "secure" / PUBLIC_KEY)))
    _, seen = load_checkpoint(latest_checkpoint(tmp_path / "plain"))  # type: ignore[arg-type]
    # Each device's weights, scaled by its count / max_weight, are rounded stochastically
    # to a step of 2 * 8 / 2**22 (SecAgg+'s clipping range and quantisation range), an
    # error under one step; the sum is divided by the scales' sum, so the mean is within
    # one step / (count / max_weight) of the float one. The two runs train apart, which
    # adds their own float noise (about 1e-5 here): the largest difference is held to
    # twice the bound, the mean to half of it (a sum of three roundings averages about a
    # fifth of a step).
    bound = 16 / 2**22 * MAX_EXAMPLES / TRAINED
    assert set(hidden) == set(seen)
    for name, value in seen.items():
        difference = (hidden[name].float() - value).abs()
        assert float(difference.max()) <= 2 * bound, name
        assert float(difference.mean()) <= bound / 2, name
    assert any(not torch.equal(hidden[n], v) for n, v in seen.items())  # masked, rounded
    # every stage's replies are counted: more than the plain float32 weights
    assert secure[1]["bytes_per_client"] > plain[1]["bytes_per_client"] > 0
    print(f"bytes per client per round: plain float32 {plain[1]['bytes_per_client']:.0f}, "
          f"SecAgg+ {secure[1]['bytes_per_client']:.0f}")


@pytest.mark.parametrize(("extra", "message"), [
    ({"dp-noise-multiplier": 1.0}, "cannot run with central DP"),
    ({"aggregation": "median"}, "needs 'aggregation' = 'fedavg'"),
    ({"secure-aggregation": 2}, "'secure-aggregation' must be 0 or 1"),
])
def test_what_secure_aggregation_cannot_serve_is_refused_by_name(
    extra: dict[str, object], message: str
) -> None:
    config = {**default_run_config(), "checkpoint-dir": "/tmp/ckpt", "secure-aggregation": 1,
              **extra}
    with pytest.raises(RunConfigError, match=message):
        ServerConfig.from_run_config(config)
