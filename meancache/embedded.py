"""The client's embedded upstream: the upstream server started for the client when no
upstream URL is configured. It lives here, above both sides, because the client never
imports the upstream.

- The chat runs it in-process (``start_embedded_upstream``) and registers it in the data
  dir while it runs (shared.running_upstream), so that `meancache ask` can use it too.
- `meancache ask` (``start_shared_upstream``) reuses a registered server that answers its
  key; failing one, it starts `meancache upstream background` in its own process, which
  stays for the next `ask` and exits after ``idle_exit_s`` without a request (or on
  `meancache upstream stop`). Nothing keeps running unseen: the server says so when it
  starts, its log is in the data dir, and it ends on its own.
"""

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.shared.running_upstream import (
    BACKGROUND,
    RunningUpstream,
    register,
    registered,
    unregister,
)
from meancache.upstream.precision import DEFAULT_PRECISION

if TYPE_CHECKING:
    from meancache.client.chat.session import EmbeddedUpstream
    from meancache.shared.progress import Progress
    from meancache.upstream.server.serve import BackgroundServer

BACKGROUND_LOG = "logs/upstream-background.log"
START_TIMEOUT_S = 1800.0  # a first start converts Gemma (minutes on 2 cores)


@dataclass
class SharedUpstream:
    """A registered server this process uses and does not own: ``stop`` leaves it up."""

    url: str
    api_key: str | None
    label: str

    def stop(self) -> None:
        return None


class ChatUpstream:
    """The chat's in-process server, registered while it runs."""

    def __init__(self, server: "BackgroundServer", data_dir: Path) -> None:
        self.server, self.data_dir = server, data_dir
        self.url, self.api_key, self.label = server.url, server.api_key, server.label

    def stop(self) -> None:
        unregister(self.data_dir, os.getpid())
        self.server.stop()


def start_embedded_upstream(model: str, data_dir: Path, progress: "Progress | None" = None,
                            precision: str = DEFAULT_PRECISION) -> "EmbeddedUpstream":
    """Load ``model`` (built-ins converted once into ``data_dir``, ``progress`` hearing the
    steps) in ``precision`` and serve it on a free loopback port, to holders of a key made
    for this run (blocking: seconds, a minute or more on a first conversion or int4
    export)."""
    from meancache.upstream.server.serve import BackgroundServer, private_settings

    server = BackgroundServer(model, private_settings(), data_dir=data_dir,
                              progress=progress, precision=precision).start()
    if registered(data_dir) is None:
        register(data_dir, RunningUpstream(server.url, server.api_key, model, os.getpid(),
                                           "chat"))
    return ChatUpstream(server, data_dir)


def reusable(data_dir: Path, model: str) -> RunningUpstream | None:
    """The registered server for ``model`` if it answers its key, else None."""
    from meancache.client.errors import UpstreamRequestError
    from meancache.client.upstream_client import UpstreamClient

    running = registered(data_dir)
    if running is None or running.model != model:
        return None
    try:
        UpstreamClient(running.url, running.api_key).check(timeout=5.0)
    except UpstreamRequestError:
        return None
    return running


def start_shared_upstream(model: str, data_dir: Path, progress: "Progress | None" = None
                          ) -> "EmbeddedUpstream":
    """For `meancache ask`: a running embedded upstream of ``model``, started in the
    background first when none is (see the module's docstring)."""
    running = reusable(data_dir, model)
    if running is None:
        running = _start_background(model, data_dir)
    if running.owner == BACKGROUND:
        how = (f"background server, pid {running.pid}; it exits after "
               f"{running.idle_exit_s or 0:.0f} s idle, or on `meancache upstream stop`")
    else:
        how = f"the running chat's, pid {running.pid}"
    return SharedUpstream(running.url, running.api_key, f"{model} ({how})")


def _start_background(model: str, data_dir: Path) -> RunningUpstream:
    from meancache.client.errors import UpstreamUnavailableError

    log = data_dir / BACKGROUND_LOG
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        child = subprocess.Popen(
            [sys.executable, "-m", "meancache", "--data-dir", str(data_dir), "upstream",
             "background", "--model", model], stdin=subprocess.DEVNULL, stdout=out,
            stderr=out, start_new_session=True)  # outlives this `ask`, not a terminal's ^C
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if child.poll() is not None:
            raise UpstreamUnavailableError(f"the background upstream exited at start "
                                           f"(code {child.returncode}); see {log}")
        running = registered(data_dir)
        if running is not None and running.pid == child.pid:
            return running
        time.sleep(0.1)
    child.terminate()
    raise UpstreamUnavailableError(f"the background upstream did not start within "
                                   f"{START_TIMEOUT_S:.0f} s; see {log}")
