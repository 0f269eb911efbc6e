"""Starting Flower's own server processes (SuperLink, SuperNode, `flwr run`) for the
meancache commands, with the flags this deployment needs."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from shared.errors import MeanCacheError

APP_DIR = Path(__file__).resolve().parents[1]  # the Flower app: pyproject.toml [tool.flwr.app]


class FlowerCommandError(MeanCacheError):
    """A Flower command is missing or failed."""


def flower_command(name: str) -> str:
    """The path of a Flower executable installed beside this Python."""
    candidate = Path(sys.executable).with_name(name)
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise FlowerCommandError(f"{name} is not installed (pip install 'flwr[simulation]')")
    return found


def flower_environment(**extra: str) -> dict[str, str]:
    """The environment for Flower's processes: they start helpers (flower-superexec,
    flwr-serverapp, flwr-clientapp) by name, so this Python's bin dir must be on PATH even
    when the virtualenv was never activated."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{path}" if path else bin_dir,
            "FLWR_TELEMETRY_ENABLED": "0", **extra}


def superlink_command(state_dir: Path, host: str, port: int, certificates: Path | None
                      ) -> list[str]:
    """The SuperLink serves Fleet, Control and ServerApp APIs on one port (flwr 1.4x)."""
    command = [flower_command("flower-superlink"), "--host", host, "--port", str(port),
               "--database", str(state_dir / "state.db"),
               "--disable-runtime-dependency-installation"]
    if certificates is None:
        return [*command, "--insecure"]
    return [*command, "--ssl-ca-certfile", str(certificates / "ca.crt"),
            "--ssl-certfile", str(certificates / "server.pem"),
            "--ssl-keyfile", str(certificates / "server.key")]


def supernode_command(superlink: str, port: int, data_dir: Path,
                      root_certificate: Path | None) -> list[str]:
    command = [flower_command("flower-supernode"), "--superlink", superlink,
               "--port", str(port), "--node-config", f"data-dir='{data_dir}'"]
    if root_certificate is None:
        return [*command, "--insecure"]
    return [*command, "--root-certificates", str(root_certificate)]


def write_connection(flwr_home: Path, superlink: str, root_certificate: Path | None) -> None:
    """The `meancache` SuperLink connection in a FLWR_HOME of our own."""
    flwr_home.mkdir(parents=True, exist_ok=True)
    security = (f'root-certificates = "{root_certificate}"' if root_certificate
                else "insecure = true")
    (flwr_home / "config.toml").write_text(
        f'[superlink]\ndefault = "meancache"\n\n[superlink.meancache]\n'
        f'address = "{superlink}"\n{security}\n'
    )


def run_command(superlink: str, run_config: str, flwr_home: Path,
                root_certificate: Path | None) -> tuple[list[str], dict[str, str]]:
    write_connection(flwr_home, superlink, root_certificate)
    env = flower_environment(FLWR_HOME=str(flwr_home))
    command = [flower_command("flwr"), "run", str(APP_DIR), "meancache", "--stream"]
    if run_config:
        command += ["--run-config", run_config]
    return command, env


def run_foreground(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run until it exits or we are interrupted (then stop it too)."""
    process = subprocess.Popen(command, env=env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait(timeout=30)
