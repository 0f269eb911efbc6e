"""FederatedParticipation: the chat's SuperNode process and the rounds it keeps."""

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from meancache.client.config import load_settings
from meancache.client.errors import ConfigError
from meancache.client.fl.participation import FederatedParticipation
from meancache.shared.fl.app_signing import operator_key
from meancache.shared.fl.checkpoint import save_checkpoint

from tests.support.servers import free_port


@pytest.fixture
def participation(tmp_path: Path) -> Iterator[FederatedParticipation]:
    # Nothing listens on the SuperLink port: the SuperNode starts and keeps retrying.
    operator_key(tmp_path / "operator" / "app-signing-key")
    settings = load_settings(config_dir=tmp_path / "config", data_dir=tmp_path / "data",
                             environ={}).model_copy(update=dict(
        fl_superlink=f"127.0.0.1:{free_port()}",
        fl_app_public_key=str(tmp_path / "operator" / "app-signing-key.pub")))
    federation = FederatedParticipation(settings)
    yield federation
    federation.stop()


def test_poll_reports_each_new_round_once(participation: FederatedParticipation) -> None:
    participation.start()
    assert participation.running and participation.known_round is None
    assert participation.process is not None
    assert "--trusted-entities" in participation.process.args  # type: ignore[operator]
    assert participation.poll() is None
    save_checkpoint(participation.settings.global_model_dir, 3, {"w": torch.zeros(2)},
                    0.9, "base", 1)
    assert participation.poll() == 3
    assert participation.poll() is None  # already reported
    assert participation.known_round == 3


def test_a_node_that_exits_on_its_own_stops_running(
        participation: FederatedParticipation) -> None:
    participation.start()
    process = participation.process
    assert process is not None
    process.kill()
    process.wait(timeout=30)
    assert participation.poll() is None
    assert not participation.running and participation.exit_code is not None


def test_stop_waits_for_the_node(participation: FederatedParticipation) -> None:
    participation.start()
    process = participation.process
    assert process is not None
    participation.stop()
    assert process.returncode is not None and not participation.running
    assert participation.exit_code is None  # left, not exited on its own
    participation.stop()  # leaving twice is harmless
    with pytest.raises(ConfigError, match="fl_superlink is not configured: set it"):
        FederatedParticipation(participation.settings.model_copy(
            update=dict(fl_superlink=None))).start()
    with pytest.raises(ConfigError, match="no operator app key"):  # runs only signed apps
        FederatedParticipation(participation.settings.model_copy(
            update=dict(fl_app_public_key=None))).start()
