"""Where a running embedded upstream says it is: ``<data dir>/upstream.json`` (URL, its
private key, model, process id, who started it). The chat's in-process upstream and the
background one `meancache ask` starts write it; a later `ask` (or chat) reads it to reuse
that server instead of loading the model again; `meancache upstream stop` stops a
background one. The file is owner-only (the data dir's umask): its key is the server's.
"""

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from meancache.shared.files import write_json_atomic

FILE = "upstream.json"
BACKGROUND = "background"  # started by `ask`, exits when idle; `upstream stop` stops it


@dataclass(frozen=True)
class RunningUpstream:
    url: str
    api_key: str | None
    model: str
    pid: int
    owner: str  # BACKGROUND, or "chat" (the app's own, in-process)
    idle_exit_s: float | None = None  # a background server exits after this long idle

    @property
    def alive(self) -> bool:
        """Its process still runs (the server's key check says whether it answers)."""
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not _zombie(self.pid)


def _zombie(pid: int) -> bool:
    """Exited, not yet reaped by its parent (the process that started it still runs)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:  # no /proc: trust the signal check
        return False
    return stat.rpartition(")")[2].split()[:1] == ["Z"]


def register(data_dir: Path, running: RunningUpstream) -> None:
    """Owner-only whatever the umask: the file holds the server's key."""
    path = data_dir / FILE
    write_json_atomic(path, asdict(running))
    path.chmod(0o600)


def registered(data_dir: Path) -> RunningUpstream | None:
    """The registered server whose process still runs, or None (a stale file is removed)."""
    try:
        record = json.loads((data_dir / FILE).read_text())
        running = RunningUpstream(**record)
    except (OSError, ValueError, TypeError):
        return None
    if not running.alive:
        unregister(data_dir, running.pid)
        return None
    return running


def unregister(data_dir: Path, pid: int) -> None:
    """Remove the file if it still names process ``pid`` (never another server's)."""
    path = data_dir / FILE
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass
