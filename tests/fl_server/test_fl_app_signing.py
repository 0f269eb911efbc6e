"""Signed Flower apps (issue 26): a stock SuperNode started as `meancache fl join` starts it
(``--trusted-entities`` with the operator's key) refuses an app the operator did not sign,
and one whose signature is for other bytes, when the real SuperLink behind the real Fleet
gateway hands them out. (The signed app running a round: test_fl_deployment.)"""

import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from flwr.cli.build import build_fab_from_disk
from flwr.proto.fab_pb2 import Fab, GetFabResponse
from flwr.supernode.start_client_internal import _verify_fab
from meancache.client.errors import ConfigError
from meancache.client.fl.supernode import (
    supernode_command,
    supernode_environment,
    trusted_entities,
)
from meancache.fl_server.app_declaration import write_app
from meancache.fl_server.fleet_gateway import attach_signature, create_gateway
from meancache.fl_server.processes import run_command, superlink_command
from meancache.shared.fl.app_signing import (
    find_signature,
    operator_key,
    public_key_line,
    save_signature,
    sign_fab,
)
from meancache.shared.loopback_server import LoopbackServer
from meancache.shared.processes import flower_environment, free_port

from meancache.cli import main
from tests.support.fl import kill_group
from tests.support.servers import wait_for_port

UNSIGNED = "App verification is not supported by the connected SuperLink"
FORGED = "FAB verification failed"


def app(parent: Path, seed: int | None = None) -> Path:
    """The packaged app, or (``seed``) one an attacker changed: another default."""
    directory = write_app(parent)
    if seed is not None:
        declaration = (directory / "pyproject.toml").read_text()
        (directory / "pyproject.toml").write_text(declaration.replace(
            "seed = 0", f"seed = {seed}"))
    return directory


def test_the_gateway_attaches_exactly_the_signature_kept_for_the_fab(tmp_path: Path) -> None:
    key = operator_key(tmp_path / "op" / "key")
    fab = build_fab_from_disk(app(tmp_path / "a"))
    save_signature(sign_fab(fab, key), tmp_path / "signatures")
    answer = GetFabResponse(fab=Fab(hash_str="x", content=fab)).SerializeToString()
    signed = GetFabResponse.FromString(attach_signature(answer, tmp_path / "signatures"))
    trusted = {sign_fab(fab, key).key_id: public_key_line(key.public_key())}
    assert signed.fab.verifications["valid_license"]
    assert _verify_fab(signed.fab, trusted)  # flwr's own check accepts it
    other = build_fab_from_disk(app(tmp_path / "b", seed=7))
    assert other != fab
    unsigned = GetFabResponse(fab=Fab(hash_str="y", content=other)).SerializeToString()
    assert attach_signature(unsigned, tmp_path / "signatures") == unsigned
    assert attach_signature(b"\xff not protobuf", tmp_path / "signatures") == \
        b"\xff not protobuf"
    stranger = operator_key(tmp_path / "mallory" / "key")  # same key id, another key
    forged = replace(sign_fab(fab, stranger), key_id=sign_fab(fab, key).key_id)
    assert not _verify_fab(Fab(content=fab, verifications=forged.verifications()), trusted)
    (tmp_path / "signatures" / f"{'0' * 64}.json").write_text("{" * 10_000)
    assert find_signature(tmp_path / "signatures", "0" * 64) is None
    assert find_signature(tmp_path / "signatures", "../../etc/passwd") is None


def test_a_device_joins_only_with_an_operator_key_or_an_explicit_lab_flag(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["--data-dir", str(tmp_path / "data"), "fl", "join"]) == 2
    assert "fl_app_public_key" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="not the operator's app key"):
        trusted_entities(tmp_path, "ssh-rsa AAAA", allow_unsigned_apps=False)
    assert trusted_entities(tmp_path, None, allow_unsigned_apps=True) is None
    operator_key(tmp_path / "key")
    path = trusted_entities(tmp_path, str(tmp_path / "key.pub"), allow_unsigned_apps=False)
    assert path is not None
    command = supernode_command("127.0.0.1:1", 2, tmp_path, None, trusted=path)
    assert command[command.index("--trusted-entities") + 1] == str(path)


STARTED: list["subprocess.Popen[bytes]"] = []


def start(command: list[str], env: dict[str, str], log: Path) -> None:
    STARTED.append(subprocess.Popen(command, env=env, stdout=log.open("wb"),
                                    stderr=subprocess.STDOUT, start_new_session=True))


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[tuple[int, Path, Path]]:
    """A SuperLink, the gateway in front of it and a SuperNode trusting the operator's key;
    yields the control port, the gateway's signature dir and the SuperNode's log."""
    state, signatures = tmp_path / "superlink", tmp_path / "signatures"
    state.mkdir()
    control = free_port()
    start(superlink_command(state, "127.0.0.1", control, None),
          flower_environment(FLWR_HOME=str(state / "home")), state / "log")
    gateway = LoopbackServer(create_gateway(f"127.0.0.1:{control}", None, signatures),
                             "gateway")
    device = tmp_path / "device"
    operator_key(tmp_path / "op" / "key")
    trusted = trusted_entities(device, str(tmp_path / "op" / "key.pub"), False)
    try:
        wait_for_port(control)
        assert gateway.start()
        log = tmp_path / "supernode.log"
        start(supernode_command(f"127.0.0.1:{gateway.port}", free_port(), device, None,
                                trusted=trusted), supernode_environment(device), log)
        yield control, signatures, log
    finally:
        while STARTED:
            kill_group(STARTED.pop())
        gateway.stop()


def submit(tmp_path: Path, control: int, directory: Path, encoder: Path) -> None:
    config = (f"num-server-rounds=1 min-available-nodes=1 min-train-nodes=1 "
              f"fraction-evaluate=0.0 round-timeout=30.0 top-layers=1 "
              f"checkpoint-dir='{tmp_path / 'checkpoints'}' encoder-model='{encoder}'")
    command, env = run_command(directory, f"127.0.0.1:{control}", config,
                               tmp_path / "flwr-home", None)
    start(command, env, tmp_path / f"run-{directory.parent.name}.log")


def wait_for_line(log: Path, text: str, seconds: float = 120) -> None:
    deadline = time.monotonic() + seconds
    while text not in log.read_text(errors="replace"):
        assert time.monotonic() < deadline, log.read_text(errors="replace")[-3000:]
        time.sleep(0.3)


def test_a_stock_supernode_refuses_an_unsigned_and_a_tampered_app(
        tmp_path: Path, fleet: tuple[int, Path, Path], tiny_dir: Path) -> None:
    control, signatures, log = fleet
    key = operator_key(tmp_path / "op" / "key")
    released = sign_fab(build_fab_from_disk(app(tmp_path / "released")), key)
    # Tampered: an app the operator never released, under the released app's signature.
    tampered = app(tmp_path / "tampered", seed=11)
    digest = sign_fab(build_fab_from_disk(tampered), key).fab_sha256
    forged = save_signature(replace(released, fab_sha256=digest), signatures)
    assert json.loads(forged.read_text())["signature"] == released.signature
    submit(tmp_path, control, tampered, tiny_dir)
    wait_for_line(log, FORGED)
    assert UNSIGNED not in log.read_text()
    submit(tmp_path, control, app(tmp_path / "unsigned", seed=12), tiny_dir)
    wait_for_line(log, UNSIGNED)
    assert not (tmp_path / "device" / "fl" / "global").exists()  # it never trained
