"""The chat's side of federated learning: put the newest global model in use in the open
session (after an F7 sync, or when the SuperNode kept one from a round)."""

from meancache.client.chat.session import ChatSession
from meancache.client.encoder import load_device_encoder
from meancache.client.errors import ConfigError
from meancache.client.fl.sync import SyncResult, sync_global_model
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


def describe_sync(result: SyncResult, reembedded: int) -> str:
    """What an F7 sync did, in one line."""
    if not result.changed:
        return f"already up to date (round {result.round})"
    return (f"global model of round {result.round}, threshold {result.threshold:.3f}"
            + (f"; re-embedded {reembedded} cached questions" if reembedded else ""))
