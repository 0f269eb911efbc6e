"""Shipping a federated global model: `meancache fl simulate --publish` makes the trained
global model the FL server's newest round, signed with the server's key, and a new user's
`fl sync` to that server installs it (tiny encoder, real Flower simulation, real HTTP)."""

from pathlib import Path

import pytest
from meancache.client.config import load_settings
from meancache.client.encoder import load_device_encoder
from meancache.client.fl.sync import sync_global_model
from meancache.fl_server.model_endpoint import create_model_app
from meancache.fl_server.publish import publish
from meancache.shared.errors import CheckpointError
from meancache.shared.fl.checkpoint import latest_checkpoint, read_meta
from meancache.shared.fl.signing import PUBLIC_KEY

from meancache.cli import main
from tests.support.fl import cache_threshold
from tests.support.servers import serving
from tests.support.tiny_encoder import make_tiny_encoder


def test_a_simulated_global_model_is_published_and_a_new_user_installs_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tiny = make_tiny_encoder(tmp_path / "tiny")
    server = tmp_path / "server"
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["--data-dir", str(server), "--encoder", str(tiny), "fl", "simulate",
                 "--clients", "2", "--per-round", "2", "--rounds", "1",
                 "--pairs-per-client", "30", "--held-out", "0", "--top-layers", "1",
                 "--verifier-layers", "0", "--publish"]) == 0
    server_dir = server / "fl-server" / "checkpoints"
    simulated = read_meta(latest_checkpoint(server / "fl-simulation"))  # type: ignore[arg-type]
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
