"""Federated learning from the chat app: sync the newest global model, or run this
user's SuperNode so the device takes part in rounds. Both are off until configured."""

import subprocess
from pathlib import Path

from meancache.client.chat.session import ChatSession
from meancache.client.encoder import load_device_encoder
from meancache.client.fl.supernode import start_supernode as start_process
from meancache.client.fl.sync import SyncResult, sync_global_model
from meancache.shared.fl.checkpoint import latest_checkpoint, read_meta
from meancache.shared.progress import Progress


def sync_and_switch(session: ChatSession, download: Progress, reembed: Progress
                    ) -> tuple[SyncResult, int]:
    """Download the global model if newer, then re-embed the cache under it (blocking)."""
    url = session.settings.fl_server_url
    if url is None:
        raise ValueError("fl_server_url is not configured")
    result = sync_global_model(url, session.settings, download)
    return result, switch_to_latest(session, reembed)


def switch_to_latest(session: ChatSession, reembed: Progress) -> int:
    """Run the newest kept global model; re-embeds the cache if the encoder changed."""
    encoder = load_device_encoder(session.settings)
    if encoder.version == session.cache.encoder.version:
        return 0
    return session.cache.set_encoder(encoder, reembed)


def latest_round(session: ChatSession) -> int | None:
    checkpoint = latest_checkpoint(session.settings.global_model_dir)
    return None if checkpoint is None else read_meta(checkpoint).round


def start_supernode(session: ChatSession, port: int) -> "subprocess.Popen[bytes]":
    """This user's SuperNode (what `meancache fl join` runs), logging to a file."""
    settings = session.settings
    if settings.fl_superlink is None:
        raise ValueError("fl_superlink is not configured")
    certificate = Path(settings.fl_root_certificate) if settings.fl_root_certificate else None
    return start_process(settings.fl_superlink, port, settings.data_dir, certificate,
                         settings.data_dir / "logs" / "supernode.log")
