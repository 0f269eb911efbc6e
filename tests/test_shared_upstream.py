"""`meancache ask` without an upstream URL: the first starts the embedded upstream in a
background process that registers itself in the data dir, the second reuses it (no second
model start), `meancache upstream stop` ends it, and idle it ends on its own."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from meancache.shared.running_upstream import BACKGROUND, FILE, RunningUpstream, registered

from meancache.cli import main


def gone(running: RunningUpstream, seconds: float = 30) -> bool:
    """Its process ended (exited: a zombie until this test process, its parent, ends)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running.alive:
            return True
        time.sleep(0.1)
    return False


def test_a_second_ask_reuses_the_background_upstream_until_stopped(
        data_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ask = ["ask", "--model", "builtin:tiny", "--json"]
    try:
        assert main([*ask, "How do I boil an egg?"]) == 0
        first = json.loads(capsys.readouterr().out)
        running = registered(data_dir)
        assert running is not None and running.owner == BACKGROUND
        assert (data_dir / FILE).stat().st_mode & 0o077 == 0  # it holds the server's key
        assert running.pid != os.getpid()  # its own process, outliving the `ask`
        assert main([*ask, "Why is the sky blue?"]) == 0
        captured = capsys.readouterr()
        second = json.loads(captured.out)
        assert (first["source"], second["source"]) == ("upstream", "upstream")
        assert f"background server, pid {running.pid}" in captured.err  # said, not hidden
        again = registered(data_dir)
        assert again is not None and again.pid == running.pid  # reused, not started again
    finally:
        assert main(["upstream", "stop"]) == 0
    assert running is not None and gone(running)
    assert not (data_dir / FILE).exists()
    assert main(["upstream", "stop"]) == 0  # nothing left to stop: says so, no error
    assert "no embedded upstream is running" in capsys.readouterr().err


@pytest.mark.slow(20)
def test_an_idle_background_upstream_exits_and_unregisters(tmp_path: Path) -> None:
    data = tmp_path / "data"
    env = os.environ | {"MEANCACHE_DATA_DIR": str(data),
                        "MEANCACHE_CONFIG_DIR": str(tmp_path / "config")}
    child = subprocess.Popen([sys.executable, "-m", "meancache", "upstream", "background",
                              "--model", "builtin:tiny", "--idle-exit", "1"], env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _, err = child.communicate(timeout=120)
    finally:
        child.kill()
    assert child.returncode == 0, err
    assert "in the background" in err and "meancache upstream stop" in err
    assert not (data / FILE).exists()
