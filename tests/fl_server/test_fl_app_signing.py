"""Signed Flower apps (issue 26): a stock SuperNode started as `meancache fl join` starts it
(``--trusted-entities`` with the operator's key) refuses an app the operator did not sign,
and one whose signature is for other bytes, when the real SuperLink behind the real Fleet
gateway hands them out; and (issue 38, finding 6) a signed app submitted with overrides of
settings devices read or that shape what they receive, which its signature does not cover.
(The signed app running a round: test_fl_deployment.)"""

import hashlib
import json
import subprocess
import time
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.cli.build import build_fab_from_disk
from flwr.proto.fab_pb2 import Fab, GetFabRequest, GetFabResponse
from flwr.proto.run_pb2 import GetRunResponse, Run
from flwr.supernode.start_client_internal import _verify_fab
from meancache.client.errors import ConfigError
from meancache.client.fl.supernode import (
    supernode_command,
    supernode_environment,
    trusted_entities,
)
from meancache.fl_server.app_declaration import default_run_config, write_app
from meancache.fl_server.config import FlServerSettings
from meancache.fl_server.fleet_gateway import (
    RunChecks,
    attach_signature,
    create_gateway,
    strip_signature,
)
from meancache.fl_server.processes import run_command, superlink_command
from meancache.fl_server.server_commands import split_run_config
from meancache.shared.fl.app_signing import (
    find_signature,
    operator_key,
    public_key_line,
    save_signature,
    sign_fab,
)
from meancache.shared.fl.checkpoint import latest_checkpoint
from meancache.shared.fl.client_config import ClientConfig
from meancache.shared.fl.run_config import DEVICE_KEYS, SIGNED_KEYS
from meancache.shared.fl.signing import PUBLIC_KEY
from meancache.shared.loopback_server import LoopbackServer
from meancache.shared.processes import flower_environment, free_port

from meancache.cli import main
from tests.support.fl import kill_group
from tests.support.servers import wait_for_port

UNSIGNED = "App verification is not supported by the connected SuperLink"
FORGED = "FAB verification failed"


def app(parent: Path, seed: int | None = None, device: dict[str, Any] | None = None
        ) -> Path:
    """The packaged app with ``device`` settings written in (as `fl sign-app` and `fl run`
    write them), or (``seed``) one an attacker changed: another default."""
    directory = write_app(parent, device)
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


@pytest.mark.parametrize(("where", "said"), [
    ("folder", "folder is not a file: give --key the operator's private key"),
    ("file/key", "cannot make the operator's key at {tmp}/file/key: File exists"),
], ids=["a-directory", "under-a-file"])
def test_an_operator_key_path_it_cannot_use_is_named(
        tmp_path: Path, where: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    """A directory given as --key ended `fl sign-app` in a FileExistsError traceback."""
    (tmp_path / "folder").mkdir()
    (tmp_path / "file").write_text("")
    assert main(["--data-dir", str(tmp_path / "data"), "fl", "sign-app",
                 "--key", str(tmp_path / where)]) == 2
    assert said.format(tmp=tmp_path) in " ".join(capsys.readouterr().err.split())


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


class Fleet(NamedTuple):
    """A SuperLink, the gateway in front of it and a SuperNode trusting the operator's
    key, which every test of the module submits its runs to (each start of one costs
    about 11 CPU-s): each test reads only what its own runs made the SuperNode log, and
    compares the device's global models with what it had before them."""

    control: int  # the SuperLink's control port
    signatures: Path  # the gateway's signature dir
    log: Path  # the SuperNode's log
    key: Ed25519PrivateKey  # the operator's app-signing key
    device: Path  # the device's data dir
    checkpoints: Path  # where the runs' ServerApp signs its global models

    def said(self, since: int) -> str:
        """What the SuperNode logged after the first ``since`` bytes of its log."""
        return self.log.read_bytes()[since:].decode(errors="replace")

    def wait_for_line(self, text: str, since: int, seconds: float = 120) -> None:
        deadline = time.monotonic() + seconds
        while text not in self.said(since):
            assert time.monotonic() < deadline, self.said(since)[-3000:]
            time.sleep(0.3)

    def kept(self) -> list[Path]:
        """Every file of the global models the device kept."""
        return sorted((self.device / "fl" / "global").rglob("*"))


def start(command: list[str], env: dict[str, str], log: Path,
          started: list["subprocess.Popen[bytes]"]) -> None:
    started.append(subprocess.Popen(command, env=env, stdout=log.open("ab"),
                                    stderr=subprocess.STDOUT, start_new_session=True))


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    root = tmp_path_factory.mktemp("fleet")
    state, signatures = root / "superlink", root / "signatures"
    state.mkdir()
    control = free_port()
    started: list[subprocess.Popen[bytes]] = []
    start(superlink_command(state, "127.0.0.1", control, None),
          flower_environment(FLWR_HOME=str(state / "home")), state / "log", started)
    gateway = LoopbackServer(create_gateway(f"127.0.0.1:{control}", None, signatures),
                             "gateway")
    device = root / "device"
    key = operator_key(root / "op" / "key")
    trusted = trusted_entities(device, str(root / "op" / "key.pub"), False)
    try:
        wait_for_port(control)
        assert gateway.start()
        log = root / "supernode.log"
        # The device keeps a round's global model only signed by the key of the server
        # the runs name (their checkpoint-dir, where the ServerApp makes it).
        environment = supernode_environment(device) | {
            "MEANCACHE_FL_SERVER_PUBLIC_KEY": str(root / "checkpoints" / PUBLIC_KEY)}
        start(supernode_command(f"127.0.0.1:{gateway.port}", free_port(), device, None,
                                trusted=trusted), environment, log, started)
        yield Fleet(control, signatures, log, key, device, root / "checkpoints")
    finally:
        while started:
            kill_group(started.pop())
        gateway.stop()


@pytest.fixture
def runs() -> Iterator[list["subprocess.Popen[bytes]"]]:
    """The `flwr run` processes a test submits with, stopped when it ends."""
    started: list[subprocess.Popen[bytes]] = []
    yield started
    while started:
        kill_group(started.pop())


def device_settings(encoder: Path) -> dict[str, Any]:
    return {"encoder-model": str(encoder), "top-layers": 1, "min-pairs": 0,
            "verifier-top-layers": 0}


def submit(tmp_path: Path, control: int, directory: Path,
           runs: list["subprocess.Popen[bytes]"], extra: str = "",
           checkpoints: Path | None = None) -> None:
    """`flwr run` of the app in ``directory`` with the server's settings and ``extra``;
    the ServerApp's checkpoints in ``checkpoints`` (by default the test's own)."""
    checkpoints = checkpoints or tmp_path / "checkpoints"
    config = (f"num-server-rounds=1 min-available-nodes=1 min-train-nodes=1 "
              f"fraction-evaluate=0.0 round-timeout=60.0 "
              f"checkpoint-dir='{checkpoints}' {extra}").strip()
    command, env = run_command(directory, f"127.0.0.1:{control}", config,
                               tmp_path / "flwr-home", None)
    start(command, env, tmp_path / f"run-{directory.parent.name}.log", runs)


@pytest.mark.slow(40)
def test_a_stock_supernode_refuses_an_unsigned_and_a_tampered_app(
        tmp_path: Path, fleet: Fleet, runs: list["subprocess.Popen[bytes]"],
        tiny_dir: Path) -> None:
    since, kept = fleet.log.stat().st_size, fleet.kept()
    device = device_settings(tiny_dir)
    released = sign_fab(build_fab_from_disk(app(tmp_path / "released", device=device)),
                        fleet.key)
    # Tampered: an app the operator never released, under the released app's signature.
    tampered = app(tmp_path / "tampered", seed=11, device=device)
    digest = sign_fab(build_fab_from_disk(tampered), fleet.key).fab_sha256
    forged = save_signature(replace(released, fab_sha256=digest), fleet.signatures)
    assert json.loads(forged.read_text())["signature"] == released.signature
    submit(tmp_path, fleet.control, tampered, runs)
    fleet.wait_for_line(FORGED, since)
    assert UNSIGNED not in fleet.said(since)
    submit(tmp_path, fleet.control, app(tmp_path / "unsigned", seed=12, device=device), runs)
    fleet.wait_for_line(UNSIGNED, since)
    assert fleet.kept() == kept  # it never trained


@pytest.mark.slow(60)
def test_a_signed_app_runs_only_without_overrides_of_what_devices_read(
        tmp_path: Path, fleet: Fleet, runs: list["subprocess.Popen[bytes]"],
        tiny_dir: Path) -> None:
    """Issue 38, finding 6: `--run-config` overrides travel beside the signed app. One of
    a setting devices read (here the local learning rate) gets the app unsigned, so the
    device refuses it; the same signed app with the server's settings only runs."""
    since, kept = fleet.log.stat().st_size, fleet.kept()
    signed = app(tmp_path / "released", device=device_settings(tiny_dir))
    save_signature(sign_fab(build_fab_from_disk(signed), fleet.key), fleet.signatures)
    submit(tmp_path, fleet.control, signed, runs, "learning-rate=1e30 epochs=50",
           fleet.checkpoints)
    fleet.wait_for_line(UNSIGNED, since)
    assert FORGED not in fleet.said(since)
    assert fleet.kept() == kept
    # the server's settings only: the device runs it (no evidence round after it: a
    # server's key, outside the signature, which would cost the device another ClientApp)
    submit(tmp_path, fleet.control, signed, runs, "evidence-round=0", fleet.checkpoints)
    deadline = time.monotonic() + 180
    global_models = fleet.device / "fl" / "global"
    while latest_checkpoint(global_models) is None or fleet.kept() == kept:
        assert time.monotonic() < deadline, fleet.said(since)[-3000:]
        time.sleep(0.3)
    assert fleet.said(since).count(UNSIGNED) == 1


def test_a_signed_app_runs_only_without_overrides_of_what_devices_receive(
        tmp_path: Path, fleet: Fleet, runs: list["subprocess.Popen[bytes]"],
        tiny_dir: Path) -> None:
    """Overrides of the server's keys that shape the weights and threshold devices are
    sent (a threshold band wide enough to move tau anywhere in one round, screening that
    lets any update through) get the signed app unsigned as a device key's do."""
    since, kept = fleet.log.stat().st_size, fleet.kept()
    signed = app(tmp_path / "released", device=device_settings(tiny_dir))
    save_signature(sign_fab(build_fab_from_disk(signed), fleet.key), fleet.signatures)
    submit(tmp_path, fleet.control, signed, runs, "threshold-band=1.0 max-update-norm=1e30")
    fleet.wait_for_line(UNSIGNED, since)
    assert fleet.kept() == kept


def test_keys_shaping_what_devices_receive_go_into_the_signed_app(
        tmp_path: Path) -> None:
    settings = FlServerSettings.load(config_dir=tmp_path / "cfg", environ={},
                                     data_dir=tmp_path / "data", encoder_model="minilm")
    signed, server = split_run_config(settings, (
        "aggregation='median' threshold-band=0.1 threshold-prior-pairs=9 "
        "threshold-min-pairs=3 max-examples=5 max-update-norm=1.5 dp-noise-multiplier=0.5 "
        "dp-clipping-norm=0.3 secure-aggregation=0 num-server-rounds=4 min-train-nodes=3 "
        "round-timeout=9.0 "
        "held-out-pairs=7 dp-delta=1e-6"))
    assert set(signed) == {"encoder-model", "aggregation", "threshold-band",
                           "threshold-prior-pairs", "threshold-min-pairs", "max-examples",
                           "max-update-norm", "dp-noise-multiplier", "dp-clipping-norm",
                           "secure-aggregation"}
    assert set(server) == {"num-server-rounds", "min-train-nodes", "round-timeout",
                           "held-out-pairs", "dp-delta"}
    assert signed.keys() <= SIGNED_KEYS and not server.keys() & SIGNED_KEYS


def test_fl_run_warns_when_the_app_it_submits_is_not_signed(
        tmp_path: Path, capfd: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Signed with `fl sign-app --run-config` X, `fl run --run-config` X says nothing;
    with other device settings it warns that devices will refuse the app. (No SuperLink:
    a missing CA certificate ends `flwr run` at once, after the check.)"""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    data = ["--data-dir", str(tmp_path / "data"), "--encoder", "minilm", "fl"]
    assert main([*data, "sign-app", "--run-config", "epochs=2 aggregation='median'"]) == 0
    capfd.readouterr()
    run = [*data, "run", "--superlink", f"127.0.0.1:{free_port()}",
           "--root-certificate", str(tmp_path / "absent-ca.crt"), "--run-config"]
    main([*run, "epochs=2 aggregation='median' min-train-nodes=3"])
    assert "not signed" not in capfd.readouterr().err
    for unsigned in ("epochs=3 aggregation='median'", "epochs=2 aggregation='fedavg'"):
        main([*run, unsigned])
        err = capfd.readouterr().err
        assert "warning: this app" in err and "is not signed in" in err, err
        assert "devices that run only the operator's apps refuse it" in err, err


def get_run_answer(run_id: int, **overrides: int) -> bytes:
    run = Run(run_id=run_id)
    for name, value in overrides.items():
        run.override_config[name.replace("_", "-")].sint64 = value
    return GetRunResponse(run=run).SerializeToString()


def test_the_gateway_signs_only_runs_it_saw_override_no_device_setting() -> None:
    checks = RunChecks(limit=2)
    checks.saw(get_run_answer(1, num_server_rounds=3))  # the server's own: fine
    checks.saw(get_run_answer(2, epochs=9))
    assert checks.may_sign(GetFabRequest(run_id=1, hash_str="h").SerializeToString())
    assert not checks.may_sign(GetFabRequest(run_id=2, hash_str="h").SerializeToString())
    assert not checks.may_sign(GetFabRequest(run_id=3, hash_str="h").SerializeToString())
    assert not checks.may_sign(b"\xff not protobuf")
    shaping = RunChecks()
    shaping.saw(get_run_answer(5, threshold_min_pairs=1))  # shapes the threshold sent
    assert not shaping.may_sign(GetFabRequest(run_id=5).SerializeToString())
    checks.saw(get_run_answer(3))
    checks.saw(get_run_answer(4))  # run 1 is forgotten: its app would go out unsigned
    assert not checks.may_sign(GetFabRequest(run_id=1).SerializeToString())
    assert checks.may_sign(GetFabRequest(run_id=4).SerializeToString())
    fab = GetFabResponse(fab=Fab(content=b"x", verifications={"valid_license": "y"}))
    assert not GetFabResponse.FromString(
        strip_signature(fab.SerializeToString())).fab.verifications


def test_device_keys_are_exactly_what_the_client_app_reads() -> None:
    read: set[str] = set()

    class Recording(dict[str, Any]):
        def __getitem__(self, key: str) -> Any:
            read.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            read.add(str(key))
            return super().__contains__(key)

    ClientConfig.from_run_config(Recording(default_run_config()))
    assert read == DEVICE_KEYS


def test_sign_app_and_run_write_the_same_device_settings_into_the_app(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    data = tmp_path / "data"
    assert main(["--data-dir", str(data), "--encoder", "minilm", "fl", "sign-app",
                 "--run-config", "epochs=2 min-train-nodes=4"]) == 0
    assert "devices running encoder-model='minilm' epochs=2" in capsys.readouterr().err
    settings = FlServerSettings.load(config_dir=tmp_path / "cfg", environ={}, data_dir=data,
                                     encoder_model="minilm")
    device, server = split_run_config(settings, "min-train-nodes=4 epochs=2")
    assert (device, server) == ({"encoder-model": "minilm", "epochs": 2},
                                {"min-train-nodes": 4})
    fab = build_fab_from_disk(write_app(tmp_path / "run", device))
    assert find_signature(settings.app_signature_dir, hashlib.sha256(fab).hexdigest())
    assert main(["--data-dir", str(data), "fl", "sign-app", "--run-config", "nope=1"]) == 2
    assert "the app has no key nope" in capsys.readouterr().err


@pytest.mark.parametrize(("command", "said"), [
    (["sign-app", "--run-config", "epochs=0"], "run config 'epochs' must be >= 1, not 0"),
    (["sign-app", "--run-config", "learning-rate=-1.0"],
     "run config 'learning-rate' must be > 0, not -1.0"),
    (["sign-app", "--run-config", "dp-noise-multiplier=1.0 dp-clipping-norm=0.0"],
     "'dp-clipping-norm' must be > 0 with central DP"),
    (["run", "--superlink", "127.0.0.1:9", "--run-config", "num-server-rounds=0"],
     "run config 'num-server-rounds' must be >= 1, not 0"),
    # Flower's reading dropped these words without a word: signed without the setting
    (["sign-app", "--run-config", "epochs="], "--run-config: 'epochs=' is not key=value"),
    (["sign-app", "--run-config", "epochs=2 aggregation"],
     "--run-config: 'aggregation' is not key=value"),
    (["run", "--superlink", "127.0.0.1:9", "--run-config", "rounds"],
     "--run-config: 'rounds' is not key=value"),
    (["sign-app", "--run-config", "/nonexistent/settings.toml"],
     "--run-config: cannot read /nonexistent/settings.toml: No such file or directory"),
])
def test_an_app_whose_devices_or_server_would_fail_is_neither_signed_nor_sent(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch, command: list[str], said: str) -> None:
    """Both apps' own checks, run before signing or submitting: such an app was signed,
    and every device then failed every round of it."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    data = tmp_path / "data"
    assert main(["--data-dir", str(data), "--encoder", "minilm", "fl", *command]) == 2
    assert said in " ".join(capsys.readouterr().err.split())
    assert not (data / "fl-server" / "app-signatures").exists()
    assert not (data / "fl-operator").exists()
