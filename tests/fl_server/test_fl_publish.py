"""Shipping a federated global model: `meancache fl simulate --publish` makes the trained
global model the FL server's newest round, signed with the server's key, and a new user's
`fl sync` to that server installs it (tiny encoder, real Flower simulation, real HTTP).
The simulation trains with central differential privacy, whose noise and privacy spent
are checked on the same model."""

import json
from pathlib import Path

import pytest
import torch
from meancache.client.config import load_settings
from meancache.client.encoder import load_device_encoder
from meancache.client.fl.sync import sync_global_model
from meancache.fl_server.model_endpoint import create_model_app
from meancache.fl_server.publish import publish
from meancache.fl_server.rounds import HISTORY
from meancache.shared.errors import CheckpointError
from meancache.shared.fl.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    read_meta,
    save_checkpoint,
)
from meancache.shared.fl.signing import PUBLIC_KEY
from meancache.shared.fl.weights import federated_names, federated_state
from sentence_transformers import SentenceTransformer

from meancache.cli import main
from tests.support.fl import cache_threshold, gaussian_rdp_epsilon
from tests.support.servers import serving
from tests.support.tiny_encoder import make_tiny_encoder


@pytest.mark.slow(40)
def test_a_simulated_global_model_is_published_and_a_new_user_installs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = make_tiny_encoder(tmp_path / "tiny")
    server = tmp_path / "server"
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    sigma, clip, devices = 5.0, 0.1, 2
    assert main(["--data-dir", str(server), "--encoder", str(tiny), "fl", "simulate",
                 "--clients", str(devices), "--per-round", str(devices), "--rounds", "1",
                 "--pairs-per-client", "30", "--held-out", "0", "--top-layers", "1",
                 "--verifier-layers", "0", "--dp-noise", str(sigma), "--dp-clip", str(clip),
                 "--workers", "1", "--publish"]) == 0
    server_dir = server / "fl-server" / "checkpoints"
    simulated = read_meta(latest_checkpoint(server / "fl-simulation"))  # type: ignore[arg-type]

    # Central DP: the global model is the initial one plus the average of updates clipped
    # to `clip` (an L2 norm of at most `clip`) plus Gaussian noise of sigma * clip / devices
    # on each of its d values (norm ~ that * sqrt(d), within 1% for d in the thousands).
    # Without the noise, or with noise for one device instead of the two averaged, the
    # norm of the change falls far outside this band.
    _, trained = load_checkpoint(
        latest_checkpoint(server / "fl-simulation"))  # type: ignore[arg-type]
    model = SentenceTransformer(str(tiny), device="cpu")
    initial = federated_state(model, federated_names(model, 1))
    change = torch.cat([(trained[k] - initial[k]).flatten() for k in initial])
    expected = sigma * clip / devices * change.numel() ** 0.5
    assert abs(float(change.norm()) - expected) < clip + 0.05 * expected
    # The privacy spent is reported after the round and kept with the checkpoint.
    history = (server / "fl-simulation" / HISTORY).read_text().splitlines()
    assert json.loads(history[-1])["epsilon"] == pytest.approx(
        gaussian_rdp_epsilon(sigma, 1, 1e-5))
    assert simulated.metrics["epsilon"] == pytest.approx(json.loads(history[-1])["epsilon"])
    assert simulated.metrics["delta"] == 1e-5

    published = read_meta(latest_checkpoint(server_dir))  # type: ignore[arg-type]
    assert published.sha256 == simulated.sha256 and published.threshold == simulated.threshold
    assert published.signature != simulated.signature  # the server's key, not the run's

    user = load_settings(config_dir=tmp_path / "user-cfg", data_dir=tmp_path / "user",
                         environ={}, encoder_model=str(tiny), encoder_backend="torch",
                         ).model_copy(update={"fl_server_public_key": str(server_dir / PUBLIC_KEY)})
    before = load_device_encoder(user).version
    with serving(create_model_app(server_dir)) as url:
        result = sync_global_model(url, user)
    assert result.changed and result.round == published.round
    assert load_device_encoder(user).version != before  # the federated weights are in use
    assert cache_threshold(user) == pytest.approx(published.threshold)

    again = publish(server / "fl-simulation", server_dir)  # a second publish: the next round
    assert again.round == published.round + 1
    with pytest.raises(CheckpointError, match="holds no global model to publish"):
        publish(tmp_path / "nothing", server_dir)


def test_publishing_keeps_what_the_verifier_was_trained_from(tmp_path: Path) -> None:
    """A published model keeps the sha256 of the int8 verifier its verifier tensors were
    trained over: devices refuse verifier tensors whose base is not theirs, so a model
    published without it would be refused (or worse, applied over another base)."""
    simulated = tmp_path / "fl-simulation"
    state = {"verifier.layer.weight": torch.zeros(2, 2)}
    save_checkpoint(simulated, 1, state, 0.8, "tiny", 1, verifier_base="ab" * 32)
    published = publish(simulated, tmp_path / "server")
    assert published.verifier_base == "ab" * 32
    assert read_meta(latest_checkpoint(tmp_path / "server")).verifier_base == "ab" * 32
