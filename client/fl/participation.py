"""This user's SuperNode while the device takes part in federated rounds (F8 in the chat;
`meancache fl join` runs the same node in the foreground), and the newest global model
round it has kept."""

import subprocess
import threading

from meancache.client.config import Settings
from meancache.client.errors import ConfigError
from meancache.client.fl.supernode import start_supernode, trusted_entities
from meancache.shared.fl.checkpoint import latest_checkpoint, read_meta
from meancache.shared.processes import free_port


def latest_round(settings: Settings) -> int | None:
    checkpoint = latest_checkpoint(settings.global_model_dir)
    return None if checkpoint is None else read_meta(checkpoint).round


class FederatedParticipation:
    """Blocking (starting and stopping the node, reading the kept rounds): call it from a
    worker thread. One call runs at a time, so a second join waits for the first."""

    def __init__(self, settings: Settings, stop_timeout: float = 10.0) -> None:
        self.settings = settings
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.known_round: int | None = None
        self.exit_code: int | None = None  # set when the node exited on its own
        self._lock = threading.RLock()

    @property
    def running(self) -> bool:
        return self.process is not None

    def start(self) -> None:
        """Start the SuperNode, logging to logs/supernode.log in the data dir."""
        settings = self.settings
        if settings.fl_superlink is None:
            raise ConfigError("fl_superlink is not configured: set it in config.toml or "
                              "MEANCACHE_FL_SUPERLINK to the SuperLink's HOST:PORT")
        with self._lock:
            if self.process is not None:
                return
            trusted = trusted_entities(settings.data_dir, settings.fl_app_public_key,
                                       settings.fl_allow_unsigned_apps)
            self.known_round, self.exit_code = latest_round(settings), None
            self.process = start_supernode(settings.fl_superlink, free_port(),
                                           settings.data_dir, settings.fl_certificate,
                                           settings.data_dir / "logs" / "supernode.log",
                                           settings.fl_insecure, trusted)

    def stop(self) -> None:
        """Terminate the SuperNode and wait for it (killing it if it will not stop)."""
        with self._lock:
            process, self.process = self.process, None
            if process is None:
                return
            process.terminate()
            try:
                process.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    def toggle(self) -> bool:
        """Join, or leave when joined; True when the node now runs."""
        with self._lock:
            if self.running:
                self.stop()
            else:
                self.start()
            return self.running

    def poll(self) -> int | None:
        """The round of a global model kept since the last poll, if any; when the node
        has exited on its own, ``running`` turns false and ``exit_code`` says how."""
        with self._lock:
            if self.process is None:
                return None
            if (code := self.process.poll()) is not None:
                self.process, self.exit_code = None, code
                return None
            current = latest_round(self.settings)
            if current is None or current == self.known_round:
                return None
            self.known_round = current
            return current
