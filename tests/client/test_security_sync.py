"""`fl sync` installs only global models signed by the FL server's key (issue 26, item 5):
a device refuses an unsigned or wrongly signed model, and its threshold, keeps what it
had, says so in one line and exits non-zero; `--allow-unsigned` is a lab's explicit
choice. The real model endpoint no longer serves such models (test_fl_sync.py), so they
come from an impostor serving the files as they lie on disk (tests.support.fl), as
anyone answering in the endpoint's place could. Through the real command."""

import json
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import torch
from meancache.client.config import load_settings
from meancache.client.errors import SyncError
from meancache.client.fl.sync import sync_global_model
from meancache.fl_server.model_endpoint import create_model_app
from meancache.shared.fl.checkpoint import LATEST, META, round_dir, save_checkpoint
from meancache.shared.fl.signing import PUBLIC_KEY, server_key, sign

from meancache.cli import main
from tests.support.fl import cache_threshold, impostor_endpoint, publish
from tests.support.servers import serving

Sync = Callable[..., tuple[int, str]]
Make = Callable[[Path, int, float], None]


@pytest.fixture
def server_root(tmp_path: Path) -> Path:
    return tmp_path / "server"


@pytest.fixture
def url(server_root: Path) -> Iterator[str]:
    with serving(create_model_app(server_root)) as base:
        yield base


@pytest.fixture
def impostor(server_root: Path) -> Iterator[str]:
    with serving(impostor_endpoint(server_root)) as base:
        yield base


@pytest.fixture
def sync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, impostor: str,
         capsys: pytest.CaptureFixture[str]) -> Sync:
    """`meancache fl sync --server URL ARGS...` from the impostor (or ``server``) on the
    device under tmp_path/device: its exit status and stderr."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))

    def run(*args: str, server: str = impostor) -> tuple[int, str]:
        status = main(["--data-dir", str(tmp_path / "device"), "fl", "sync", "--server",
                       server, *args])
        return status, capsys.readouterr().err

    return run


def unsigned(root: Path, round_number: int, threshold: float) -> None:
    save_checkpoint(root, round_number, {"w": torch.ones(2, 2) * round_number}, threshold,
                    base_model="base", top_layers=0)


def garbage_signed(root: Path, round_number: int, threshold: float) -> None:
    unsigned(root, round_number, threshold)
    meta_file = round_dir(root, round_number) / META
    meta_file.write_text(json.dumps(json.loads(meta_file.read_text())
                                    | {"signature": "Z2FyYmFnZQ=="}))


def device_dir(tmp_path: Path) -> Path:
    return tmp_path / "device"


def installed(tmp_path: Path) -> str | None:
    latest = device_dir(tmp_path) / "fl" / "global" / LATEST
    return latest.read_text().strip() if latest.exists() else None


@pytest.mark.parametrize("make", [unsigned, garbage_signed])
def test_a_default_device_refuses_what_it_cannot_verify(sync: Sync, tmp_path: Path,
                                                        server_root: Path, make: Make
                                                        ) -> None:
    make(server_root, 1, 0.01)
    status, err = sync()
    assert status != 0
    assert err.strip().count("\n") == 0, err  # one line
    assert "refusing to install a global model nobody can verify" in err
    assert "--server-key" in err and "--allow-unsigned" in err
    assert installed(tmp_path) is None


@pytest.mark.parametrize("make", [unsigned, garbage_signed])
def test_a_device_with_the_key_refuses_an_unsigned_or_forged_model_and_its_threshold(
    sync: Sync, tmp_path: Path, server_root: Path, make: Make
) -> None:
    key, root = str(server_root / PUBLIC_KEY), server_root
    publish(root, 1, 0.8)
    assert sync("--server-key", key)[0] == 0
    make(root, 2, 0.01)
    status, err = sync("--server-key", key)
    assert status != 0 and err.strip().count("\n") == 0, err
    assert "round 2 is not signed by the FL server's key" in err
    assert installed(tmp_path) == "round-0001"  # what it had
    settings = load_settings(config_dir=tmp_path / "cfg", data_dir=device_dir(tmp_path),
                             environ={})
    assert cache_threshold(settings) == pytest.approx(0.8)  # not 0.01


def test_allow_unsigned_installs_with_a_warning(sync: Sync, tmp_path: Path,
                                                server_root: Path) -> None:
    unsigned(server_root, 1, 0.7)
    status, err = sync("--allow-unsigned")
    assert status == 0
    assert "warning: installing the global model of round 1" in err and "unverified" in err
    assert installed(tmp_path) == "round-0001"


def test_the_setting_allows_unsigned_models_for_a_lab(impostor: str, tmp_path: Path,
                                                      server_root: Path) -> None:
    unsigned(server_root, 1, 0.7)
    lab = load_settings(config_dir=tmp_path / "cfg", data_dir=device_dir(tmp_path),
                        environ={"MEANCACHE_FL_ALLOW_UNSIGNED": "true"})
    assert lab.fl_allow_unsigned
    assert sync_global_model(impostor, lab).round == 1
    default = load_settings(config_dir=tmp_path / "cfg2", data_dir=tmp_path / "other",
                            environ={})
    with pytest.raises(SyncError, match="nobody can verify"):
        sync_global_model(impostor, default)


def test_a_signed_model_is_installed_with_the_servers_key(sync: Sync, tmp_path: Path,
                                                          server_root: Path, url: str
                                                          ) -> None:
    save_checkpoint(server_root, 3, {"w": torch.zeros(2)}, 0.75, base_model="base",
                    top_layers=0, sign=partial(sign, key=server_key(server_root)))
    status, _ = sync("--server-key", str(server_root / PUBLIC_KEY), server=url)
    assert status == 0 and installed(tmp_path) == "round-0003"
