"""Federated learning from the chat app: sync the newest global model, or run this
user's SuperNode so the device takes part in rounds. Both are off until configured."""

import subprocess

from meancache.client.chat.session import ChatSession
from meancache.client.config import Settings
from meancache.client.encoder import load_device_encoder
from meancache.client.errors import ConfigError
from meancache.client.fl.supernode import start_supernode
from meancache.client.fl.sync import SyncResult, sync_global_model
from meancache.shared.fl.checkpoint import latest_checkpoint, read_meta
from meancache.shared.processes import free_port
from meancache.shared.progress import Progress


def sync_and_switch(session: ChatSession, download: Progress, reembed: Progress
                    ) -> tuple[SyncResult, int]:
    """Download the global model if newer, then re-embed the cache under it (blocking)."""
    url = session.settings.fl_server_url
    if url is None:
        raise ConfigError("fl_server_url is not configured: set it in config.toml or "
                          "MEANCACHE_FL_SERVER_URL to the FL server's global-model URL")
    result = sync_global_model(url, session.settings, download)
    return result, switch_to_latest(session, reembed)


def switch_to_latest(session: ChatSession, reembed: Progress) -> int:
    """Run the newest kept global model; the cache re-embeds only if its vector space
    changed (``SemanticCache.set_encoder`` compares the whole pipeline)."""
    return session.cache.set_encoder(load_device_encoder(session.settings), reembed)


def latest_round(settings: Settings) -> int | None:
    checkpoint = latest_checkpoint(settings.global_model_dir)
    return None if checkpoint is None else read_meta(checkpoint).round


class FederatedParticipation:
    """This user's SuperNode (what `meancache fl join` runs) while the device takes part
    in rounds, and the newest global model round it has kept.

    Blocking calls (start, stop) belong in a worker; ``poll`` is cheap enough for a timer.
    """

    def __init__(self, settings: Settings, stop_timeout: float = 10.0) -> None:
        self.settings = settings
        self.stop_timeout = stop_timeout
        self.process: subprocess.Popen[bytes] | None = None
        self.known_round: int | None = None

    @property
    def running(self) -> bool:
        return self.process is not None

    def start(self) -> None:
        """Start the SuperNode, logging to logs/supernode.log in the data dir."""
        settings = self.settings
        if settings.fl_superlink is None:
            raise ConfigError("fl_superlink is not configured: set it in config.toml or "
                              "MEANCACHE_FL_SUPERLINK to the SuperLink's HOST:PORT")
        self.known_round = latest_round(settings)
        self.process = start_supernode(settings.fl_superlink, free_port(), settings.data_dir,
                                       settings.fl_certificate,
                                       settings.data_dir / "logs" / "supernode.log",
                                       settings.fl_insecure)

    def stop(self) -> None:
        """Terminate the SuperNode and wait for it (killing it if it will not stop)."""
        process, self.process = self.process, None
        if process is None:
            return
        process.terminate()
        try:
            process.wait(timeout=self.stop_timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def poll(self) -> int | None:
        """The round of a global model kept since the last poll, if any; when the node
        has exited on its own, ``running`` turns false."""
        if self.process is None:
            return None
        if self.process.poll() is not None:
            self.process = None
            return None
        current = latest_round(self.settings)
        if current is None or current == self.known_round:
            return None
        self.known_round = current
        return current
