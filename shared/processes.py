"""Helpers every side uses to run its helper processes: free loopback ports, Flower's
executables and their environment, and a foreground child that stops with us."""

import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from meancache.shared.errors import FlowerCommandError


def free_port() -> int:
    """A TCP port on loopback that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def is_loopback(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 possibly in brackets) is this machine."""
    bare = host.strip("[]").lower()
    if bare == "localhost":
        return True
    try:
        return ipaddress.ip_address(bare).is_loopback
    except ValueError:
        return False


def flower_command(name: str) -> str:
    """The path of a Flower executable installed beside this Python."""
    candidate = Path(sys.executable).with_name(name)
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if found is None:
        raise FlowerCommandError(f"{name} is not installed; it comes with Flower: pip install flwr")
    return found


def flower_environment(**extra: str) -> dict[str, str]:
    """The environment for Flower's processes: they start helpers (flower-superexec,
    flwr-serverapp, flwr-clientapp) by name, so this Python's bin dir must be on PATH even
    when the virtualenv was never activated."""
    bin_dir = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", "")
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{path}" if path else bin_dir,
            "FLWR_TELEMETRY_ENABLED": "0", **extra}


def run_foreground(command: list[str], env: dict[str, str] | None = None) -> int:
    """Run until it exits or we are interrupted (then stop it too)."""
    process = subprocess.Popen(command, env=env)
    try:
        return process.wait()
    except KeyboardInterrupt:
        process.terminate()
        return process.wait(timeout=30)


def exit_on_sigterm() -> None:
    """Make SIGTERM (a service manager's stop) end this process as Ctrl+C does: by an
    exception, so every ``finally`` that stops a child process runs. Without it SIGTERM
    kills at once (uvicorn, too, hands the signal back once its servers have shut down),
    and children such as the SuperLink are left running, holding their ports."""
    signal.signal(signal.SIGTERM, lambda number, frame: sys.exit(128 + number))
