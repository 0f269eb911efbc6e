"""The real MPNet profile: assembled once from the installed chunk packages into a tmp
data dir, it tells a paraphrase from a different question at its own default threshold,
and a second start reuses the assembled copy."""

from pathlib import Path

import pytest
from meancache.client.config import load_settings
from meancache.client.encoder import load_device_encoder
from meancache.shared.encoder import Encoder, locate_model, profile_threshold
from meancache.shared.encoder.packaged import ASSEMBLY_STEPS, MPNET, check_assembled
from meancache.shared.threshold import MPNET_THRESHOLD


@pytest.fixture(scope="session")
def mpnet_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A data dir whose models/ holds MPNet, assembled once for the session."""
    data = tmp_path_factory.mktemp("mpnet-data")
    calls: list[tuple[int, int]] = []
    model_dir = locate_model("mpnet", data / "models", lambda d, t: calls.append((d, t)))
    assert model_dir == data / "models" / MPNET.name
    # one stable total over joining and unpacking, never going back, ending complete
    assert calls and {total for _, total in calls} == {ASSEMBLY_STEPS}
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert calls[-1][0] == ASSEMBLY_STEPS
    assert check_assembled(MPNET, model_dir) is None
    return data


@pytest.fixture(scope="session")
def mpnet(mpnet_data_dir: Path) -> Encoder:
    settings = load_settings(config_dir=mpnet_data_dir / "config", data_dir=mpnet_data_dir,
                             environ={}, encoder_backend="torch")
    assert settings.encoder_model == "mpnet"  # the default profile
    assert settings.global_threshold == MPNET_THRESHOLD == profile_threshold("mpnet")
    return load_device_encoder(settings)


def test_mpnet_matches_a_paraphrase_and_not_another_question(mpnet: Encoder) -> None:
    assert mpnet.full_dim == 768
    base, paraphrase, other = mpnet.encode([
        "How can I learn to cook rice properly?",
        "What is the best way to learn cooking rice?",
        "How can I learn to drive a car properly?",
    ])
    assert base @ paraphrase >= MPNET_THRESHOLD
    assert base @ other < MPNET_THRESHOLD


def test_a_second_start_reuses_the_assembled_copy(mpnet_data_dir: Path, mpnet: Encoder) -> None:
    weights = mpnet.model_dir / "model.safetensors"
    stamp = weights.stat().st_mtime_ns
    calls: list[tuple[int, int]] = []
    again = locate_model("mpnet", mpnet_data_dir / "models", lambda d, t: calls.append((d, t)))
    assert again == mpnet.model_dir
    assert calls == []  # no rebuild
    assert weights.stat().st_mtime_ns == stamp
