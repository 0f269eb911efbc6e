"""Deployment on loopback, through the real commands: `meancache fl server` (a Flower
SuperLink), two `meancache fl join` SuperNodes, `meancache fl run` for a SecAgg+ round and
then a round with a SuperNode killed mid-round; then a new user syncs the global model."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from meancache.client.cache.store import EntryStore
from meancache.client.config import load_settings
from meancache.client.encoder import load_device_encoder
from meancache.client.learning.bound import Label
from meancache.client.learning.state import Learned, pooled
from meancache.shared.encoder import Encoder
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.fl.checkpoint import latest_checkpoint, load_checkpoint, read_meta
from meancache.shared.fl.secure import WHOLE, sketch_share
from meancache.shared.processes import free_port
from meancache.shared.verifier.runtime import ARTEFACT_DIR, read_card

from tests.support.fl import FEEDBACK, children, device_with_feedback, kill_group, running
from tests.support.paths import DATA_DIR, REPO
from tests.support.servers import wait_for_port
from tests.support.tiny_encoder import make_tiny_encoder

SCRIPT = REPO / "deploy" / "make-certificates.sh"
# What devices run with, signed into the app (the verifier's federation is covered by
# test_fl_verifier.py and the simulation; a round of it here costs minutes).
DEVICE_SETTINGS = "top-layers=1 min-pairs=10 verifier-top-layers=0"
# The secure app's: under SecAgg+ a device clamps its own example count to max-examples
# (the server cannot see it): Bob's 96 to 90 (above the labels' median cap of 80, which
# the pooled labels below are checked against); and the upload cap, under the tiny top
# layer's 9,600 masked weights (0.077 MB), over its 5,504 entries of small tensors.
UPLOAD_MB = 0.06
SECURE_SETTINGS = f"secure-aggregation=1 max-examples=90 secure-upload-mb={UPLOAD_MB}"


class Processes:
    """Commands in their own process groups, all killed at the end."""

    def __init__(self, tmp: Path, encoder: Path) -> None:
        self.tmp, self.encoder = tmp, encoder
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, data_dir: Path, *args: str) -> subprocess.Popen[bytes]:
        env = {**os.environ, "MEANCACHE_DATA_DIR": str(data_dir),
               "MEANCACHE_CONFIG_DIR": str(self.tmp / "config")}
        log = (self.tmp / f"{data_dir.name}-{args[1]}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "meancache", "--encoder", str(self.encoder), *args],
            env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.started.append(process)
        return process

    def kill(self, process: subprocess.Popen[bytes]) -> None:
        kill_group(process)

    def stop_all(self) -> None:
        for process in self.started:
            if process.poll() is None:
                self.kill(process)


def learned_labels(data_dir: Path, count: int) -> None:
    """``count`` error-bound labels in the device's chat cache, all right, scored by the
    shipped verifier (the judge the rounds name: the verifier is not federated here),
    and 20 more scored by another, which no round pools."""
    with closing(EntryStore(data_dir / "cache")) as store:
        learned = Learned(store, 0.02, judge="another verifier")
        for i in range(20):
            learned.learn(Label(0.6, False, entry=f"o{i}"))
        learned.judge = read_card(ARTEFACT_DIR).judge
        for i in range(count):
            learned.learn(Label(0.6 + i / 1000, False, entry=f"e{i}"))


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[Processes]:
    started = Processes(tmp_path, make_tiny_encoder(tmp_path / "models"))
    yield started
    started.stop_all()


@pytest.mark.slow(130)
def test_a_secure_round_then_a_round_a_supernode_drops_out_of(tmp_path: Path,
                                                              processes: Processes) -> None:
    """One fleet, two runs: a SecAgg+ round of both SuperNodes, then a plain round one of
    them leaves mid-training; then a new user syncs the global model, and with it the
    error-bound labels the devices pooled."""
    server, alice, bob = tmp_path / "server", tmp_path / "alice", tmp_path / "bob"
    device_with_feedback(alice, FEEDBACK)
    device_with_feedback(bob, FEEDBACK * 5)  # 96 training pairs: over the secure cap
    for device, labels in ((alice, 90), (bob, 70)):  # what their caches' bounds learned
        learned_labels(device, labels)
    link, model_port, control = free_port(), free_port(), free_port()
    processes.start(server, "fl", "server", "--port", str(link),
                    "--model-port", str(model_port), "--control-port", str(control))
    # Meanwhile the operator signs the two apps, with the settings devices run with and
    # with secure aggregation (it turns the server's screening off, so only a signed app
    # may turn it on); the devices run only apps signed with that key.
    for signed in (DEVICE_SETTINGS, f"{DEVICE_SETTINGS} {SECURE_SETTINGS}"):
        assert processes.start(server, "fl", "sign-app", "--run-config",
                               signed).wait(timeout=120) == 0
    app_key = str(server / "fl-operator" / "app-signing-key.pub")
    wait_for_port(control)
    wait_for_port(link)
    wait_for_port(model_port)
    checkpoints = server / "fl-server" / "checkpoints"
    server_key = str(checkpoints / "signing-key.pub")
    processes.start(alice, "fl", "join", "--superlink", f"127.0.0.1:{link}",
                    "--port", str(free_port()), "--app-key", app_key,
                    "--server-key", server_key)
    bob_node = processes.start(bob, "fl", "join", "--superlink", f"127.0.0.1:{link}",
                               "--port", str(free_port()), "--app-key", app_key,
                               "--server-key", server_key)

    def run(settings: str) -> subprocess.Popen[bytes]:
        return processes.start(server, "fl", "run", "--superlink", f"127.0.0.1:{control}",
                               "--rounds", "1", "--run-config",
                               f"{DEVICE_SETTINGS} min-available-nodes=2 {settings} "
                               "fraction-evaluate=0.0 round-timeout=300.0")

    # SecAgg+: the server checkpoints and signs the sum of the two masked updates, and
    # each device kept the model it was sent, under the server's signed description. (The
    # evidence round after a secure run is the simulation's to check, test_fl_secure.py:
    # here it adds about 40 s; the plain run below has one.)
    secure = run(f"min-train-nodes=2 {SECURE_SETTINGS} evidence-round=0")
    assert secure.wait(timeout=400) == 0, (tmp_path / "server-run.log").read_text()
    latest = latest_checkpoint(checkpoints)
    assert latest is not None and latest.name == "round-0001"
    meta = read_meta(latest)
    assert meta.signature and meta.metrics["clients"] == 2
    assert "rejected" not in meta.metrics  # nothing was screened: the updates were hidden
    # the labels were not hidden: both devices', capped at the round's median (80)
    assert BoundEvidence.from_record(meta.bound).labels == 80 + 70
    for device in (alice, bob):
        assert latest_checkpoint(device / "fl" / "global").name == "round-0000"  # type: ignore[union-attr]
    # under the upload cap, a large tensor moved at no more than the round's share of its
    # entries (the ones both devices sent); the rest is the model they were sent
    _, summed = load_checkpoint(latest)
    _, sent = load_checkpoint(latest_checkpoint(alice / "fl" / "global"))  # type: ignore[arg-type]
    share = sketch_share([w.numel() for w in sent.values()], UPLOAD_MB * 1e6)
    assert 0 < share < 1
    for name, weights in sent.items():
        if weights.numel() > WHOLE:
            moved = int((summed[name] != weights).sum())
            assert 0 < moved <= int(share * weights.numel()), name

    # Bob has more to learn from now: his training is still running when he drops out
    # (had he had it all along, his secure round would have trained on it: a minute of CPU).
    device_with_feedback(bob, FEEDBACK * 60)
    plain = run("min-train-nodes=1")
    deadline = time.monotonic() + 180
    # Bob received the model after round 1...
    while latest_checkpoint(bob / "fl" / "global").name != "round-0001":  # type: ignore[union-attr]
        assert time.monotonic() < deadline, "Bob never started training"
        assert plain.poll() is None, (tmp_path / "server-run.log").read_text()
        time.sleep(0.2)
    processes.kill(bob_node)  # ...and vanishes mid-round
    assert plain.wait(timeout=240) == 0, (tmp_path / "server-run.log").read_text()

    latest = latest_checkpoint(checkpoints)
    assert latest is not None and latest.name == "round-0002"
    meta = read_meta(latest)
    assert meta.metrics["clients"] == 1  # only Alice's weights were averaged
    assert BoundEvidence.from_record(meta.bound).labels == 90  # and only her labels
    history = [json.loads(line) for line in (checkpoints / "history.jsonl").read_text()
               .splitlines()]
    assert [int(h["round"]) for h in history] == [0, 1, 1, 2]  # the second run continued

    # A new user downloads the global model and starts from it.
    carol = tmp_path / "carol"
    sync = processes.start(carol, "fl", "sync", "--server", f"http://127.0.0.1:{model_port}",
                           "--server-key", server_key)
    assert sync.wait(timeout=120) == 0, (tmp_path / "carol-sync.log").read_text()
    installed = latest_checkpoint(carol / "fl" / "global")
    assert installed is not None and read_meta(installed).sha256 == meta.sha256
    with closing(EntryStore(carol / "cache")) as store:
        assert pooled(store).labels == 90  # her bound starts from the fleet's labels
    settings = load_settings(config_dir=tmp_path / "config", data_dir=carol, environ={},
                             encoder_model=str(processes.encoder), encoder_backend="torch")
    base = Encoder.load(processes.encoder, backend="torch")
    assert load_device_encoder(settings).version != base.version


@pytest.mark.slow(35)
def test_supernodes_connect_over_tls_and_only_with_a_registered_key(
    tmp_path: Path, processes: Processes
) -> None:
    """One SuperLink with the certificate script's TLS and SuperNode authentication (each
    costs a fleet's start): a registered SuperNode connects over TLS, an unregistered key
    is refused, the ports speak TLS only and run submission from the devices' port is
    refused. Then a service manager's stop (SIGTERM to the server alone) leaves no
    SuperLink behind holding the control port."""
    from meancache.fl_server.processes import write_connection
    from meancache.shared.processes import flower_command, flower_environment

    certificates = tmp_path / "certs"
    subprocess.run(["bash", str(SCRIPT), str(certificates), "--supernodes", "2"], check=True,
                   capture_output=True, stdin=subprocess.DEVNULL)
    link, model_port, control = free_port(), free_port(), free_port()
    server = processes.start(tmp_path / "server", "fl", "server", "--port", str(link),
                             "--model-port", str(model_port), "--control-port", str(control),
                             "--certificates", str(certificates), "--supernode-auth")
    wait_for_port(control)
    wait_for_port(link)
    home = tmp_path / "flwr-home"
    write_connection(home, f"127.0.0.1:{control}", certificates / "ca.crt")
    env = flower_environment(FLWR_HOME=str(home))

    def flwr(*args: str) -> str:
        done = subprocess.run([flower_command("flwr"), "supernode", *args], env=env,
                              capture_output=True, text=True, stdin=subprocess.DEVNULL)
        return done.stdout + done.stderr

    registered = flwr("register", str(certificates / "supernode-1.pub"), "meancache")
    assert "error" not in registered.lower(), registered

    def join(name: str, key: str) -> subprocess.Popen[bytes]:
        return processes.start(tmp_path / name, "fl", "join", "--superlink",
                               f"127.0.0.1:{link}", "--port", str(free_port()),
                               "--root-certificate", str(certificates / "ca.crt"),
                               "--auth-key", str(certificates / key),
                               "--allow-unsigned-apps")

    join("alice", "supernode-1")
    mallory = join("mallory", "supernode-2")  # its key was never registered
    import httpx

    with pytest.raises(httpx.HTTPError) as refused:  # the port speaks TLS only
        httpx.get(f"http://127.0.0.1:{link}/v1/fleet/register-node", timeout=5)
    assert not isinstance(refused.value, httpx.ConnectError)  # it listens, but not plainly
    import ssl

    trusted = ssl.create_default_context(cafile=str(certificates / "ca.crt"))
    wait_for_port(model_port)  # the global-model endpoint speaks HTTPS with the same certificate
    health = httpx.get(f"https://127.0.0.1:{model_port}/health", verify=trusted, timeout=5)
    assert health.json() == {"status": "ok"}

    # Run submission from the devices' port is refused: only the operator, on the server
    # itself, reaches the control port.
    refused = httpx.post(f"https://127.0.0.1:{link}/v1/control/start-run", json={},
                         verify=trusted, timeout=5)
    assert refused.status_code == 403 and "runs are submitted on the FL server itself" in \
        refused.json()["error"]["message"]
    submitted = processes.start(tmp_path / "eve", "fl", "run", "--superlink",
                                f"127.0.0.1:{link}", "--root-certificate",
                                str(certificates / "ca.crt"), "--rounds", "1")
    assert submitted.wait(timeout=120) != 0
    runs = subprocess.run([flower_command("flwr"), "ls", "meancache", "--format", "json"],
                          env=env, capture_output=True, text=True)
    assert json.loads(runs.stdout[runs.stdout.index("{"):])["runs"] == [], runs.stdout

    # The SuperLink refuses to activate mallory's SuperNode, which gives up (Flower's
    # exit code 305): wait for that, then for alice to be online over TLS. Had mallory's
    # key been admitted, her process would still run (the wait times out) and two nodes
    # be listed.
    assert mallory.wait(timeout=120) != 0
    log = (tmp_path / "mallory-join.log").read_text(errors="replace")
    assert "Failed to activate SuperNode" in log, log[-2000:]
    deadline = time.monotonic() + 90
    while '"online"' not in (listed := flwr("ls", "meancache", "--format", "json")):
        assert time.monotonic() < deadline, listed
        time.sleep(1)
    nodes = json.loads(listed[listed.index("{"):])["nodes"]
    assert [node["status"] for node in nodes] == ["online"], listed  # alice's only

    superlinks = children(server.pid)
    assert superlinks, "the server started no SuperLink"
    server.send_signal(signal.SIGTERM)
    server.wait(timeout=60)
    deadline = time.monotonic() + 60
    while any(running(pid) for pid in superlinks):
        assert time.monotonic() < deadline, "the SuperLink outlived its server"
        time.sleep(0.2)
    with socket.socket() as sock:
        assert sock.connect_ex(("127.0.0.1", control)) != 0  # nothing holds the port


def test_sigterm_stops_fl_simulate_and_its_superlink(tmp_path: Path,
                                                      processes: Processes) -> None:
    """`timeout` or a service manager stopping a simulation (SIGTERM to the command alone)
    leaves no SuperLink or SuperExec behind: without the handler both ran on for good,
    each a new session of its own. Stopped as soon as its SuperLink runs."""
    simulation = processes.start(tmp_path / "server", "fl", "simulate", "--pairs",
                                 str(DATA_DIR / "qqp" / "pairs.jsonl"),
                                 "--clients", "2", "--per-round", "2", "--rounds", "1")
    deadline = time.monotonic() + 120
    while not (started := children(simulation.pid)):
        assert time.monotonic() < deadline and simulation.poll() is None, "no SuperLink"
        time.sleep(0.1)
    left = [pid for child in started for pid in (child, *children(child))]
    simulation.send_signal(signal.SIGTERM)
    assert simulation.wait(timeout=90) != 0
    deadline = time.monotonic() + 60
    while any(running(pid) for pid in left):
        assert time.monotonic() < deadline, "the SuperLink outlived the simulation"
        time.sleep(0.2)
