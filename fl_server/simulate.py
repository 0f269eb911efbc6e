"""`meancache fl simulate`: federated rounds on Flower's simulation engine (Ray).

A SuperLink of our own runs in simulation mode on a free loopback port and `flwr run`
submits to it the same Flower app as `meancache fl run` (so the installed ServerApp and
ClientApp run, in Flower's processes, not in this one). Each virtual device trains on a
partition of a labelled-pairs file; the global model is scored on held-out pairs after
every round, and this process follows the rounds in the server's history.jsonl.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import tomli_w
from meancache.fl_server.app_declaration import default_run_config, write_app
from meancache.fl_server.processes import run_command, superlink_command
from meancache.fl_server.rounds import HISTORY
from meancache.shared.errors import FlowerCommandError
from meancache.shared.extras import require
from meancache.shared.processes import flower_environment, free_port

Row = dict[str, float]
STARTUP_SECONDS = 60.0
MARKER = ".meancache-simulation"  # in a checkpoint dir this module made (and may clear)


@dataclass(frozen=True)
class SimulationConfig:
    """The simulated federation, and the run-config keys it sets over the Flower app's
    defaults (``run_config``, e.g. ``{"top-layers": 1, "num-server-rounds": 2}``)."""

    pairs: Path  # labelled pairs: the train split is partitioned, the dev split scores
    checkpoint_dir: Path
    clients: int
    per_round: int
    run_config: Mapping[str, bool | int | float | str] = field(default_factory=dict)
    # Ray workers that train the virtual devices, each a process that loads the models
    # (0: one per core): fewer than cores where memory is short or devices are tiny.
    workers: int = 0

    def full_run_config(self) -> dict[str, Any]:
        """Every override this simulation submits: ``run_config`` plus what the
        federation's shape and the pairs file decide."""
        return {**self.run_config,
                "min-available-nodes": self.clients,
                "min-train-nodes": self.per_round,
                "fraction-train": self.per_round / self.clients,
                "fraction-evaluate": 0.0,
                "min-evaluate-nodes": 0,
                "checkpoint-dir": str(self.checkpoint_dir),
                "data-source": "qqp",
                "qqp-path": str(self.pairs),
                "held-out-path": str(self.pairs),
                "cache-dir": str(self.checkpoint_dir / "partition-cache")}

    def federation_config(self) -> str:
        """One CPU per virtual device, and Ray told of ``workers`` CPUs where set (so it
        starts that many workers); its logs stay in Flower's log, not on our terminal."""
        workers = f" init-args-num-cpus={self.workers}" if self.workers else ""
        return (f"num-supernodes={self.clients} client-resources-num-cpus=1 "
                f"init-args-log-to-driver=false{workers}")

    def rounds(self) -> int:
        return int({**default_run_config(), **self.run_config}["num-server-rounds"])


def simulate(config: SimulationConfig, flwr_home: Path,
             on_round: Callable[[Row], None] | None = None) -> list[Row]:
    """Run the rounds from scratch; returns one row of metrics per round (round 0 = before
    training). ``flwr_home`` is Flower's home (never ~/.flwr): the installed app and
    Flower's output (simulation.log) go there."""
    require("ray", "server", "`meancache fl simulate` (Flower's simulation engine)")
    _fresh_checkpoint_dir(config.checkpoint_dir)
    flwr_home.mkdir(parents=True, exist_ok=True)
    log_file = flwr_home / "simulation.log"
    with tempfile.TemporaryDirectory() as tmp, log_file.open("wb") as log:
        app = write_app(Path(tmp))
        overrides = Path(tmp) / "run-config.toml"
        overrides.write_text(tomli_w.dumps(config.full_run_config()))
        port = free_port()
        superlink = _start(superlink_command(Path(tmp), "127.0.0.1", port, None,
                                             simulation=True),
                           flower_environment(FLWR_HOME=str(flwr_home)), log)
        try:
            _wait_listening(port, superlink, log_file)
            command, env = run_command(app, f"127.0.0.1:{port}", str(overrides), flwr_home,
                                       None, config.federation_config())
            run = _start(command, env, log)
            try:
                rows = _follow(config.checkpoint_dir / HISTORY, run, on_round)
            finally:
                _stop(run)
        finally:
            _stop(superlink)
    if len(rows) != config.rounds() + 1:
        raise FlowerCommandError(f"the simulation ended after {max(len(rows) - 1, 0)} of "
                                 f"{config.rounds()} rounds; see {log_file}")
    return rows


def _fresh_checkpoint_dir(directory: Path) -> None:
    """Empty ``directory`` for a run from scratch, but only if an earlier simulation made
    it (it holds MARKER) or it is empty: a directory of the user's is never deleted."""
    if directory.exists() and not (directory / MARKER).is_file():
        if not directory.is_dir() or any(directory.iterdir()):
            raise FlowerCommandError(
                f"{directory} exists and was not made by `meancache fl simulate`; pass "
                "--checkpoints with a new or empty directory")
    elif directory.exists():
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).touch()


def _start(command: list[str], env: dict[str, str], log: BinaryIO
           ) -> "subprocess.Popen[bytes]":
    """In a process group of its own, so that stopping it reaches its helpers too."""
    return subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)


def _stop(process: "subprocess.Popen[bytes]") -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    try:  # helpers it left behind (the simulation engine's workers)
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _wait_listening(port: int, process: "subprocess.Popen[bytes]", log_file: Path) -> None:
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise FlowerCommandError(f"the simulation's SuperLink exited; see {log_file}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise FlowerCommandError(f"the simulation's SuperLink did not start; see {log_file}")


def _follow(history: Path, run: "subprocess.Popen[bytes]",
            on_round: Callable[[Row], None] | None) -> list[Row]:
    """The rows of ``history`` as the server writes them, until `flwr run` exits."""
    rows: list[Row] = []
    while True:
        finished = run.poll() is not None
        text = history.read_text() if history.exists() else ""
        for line in text.split("\n")[len(rows):-1]:  # complete lines only
            rows.append(json.loads(line))
            if on_round is not None:
                on_round(rows[-1])
        if finished:
            return rows
        time.sleep(0.5)
