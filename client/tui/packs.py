"""The chat's instruction-pack action: download the upstream's newest pack and put it in
use in the open session (a failure leaves the old one answering)."""

from meancache.client.chat.session import ChatSession
from meancache.client.errors import PackDownloadError
from meancache.client.pack import PackStats, PackUpdate, download_pack
from meancache.client.pack.store import PACK_FILE
from meancache.shared.progress import Progress


def update_pack(session: ChatSession, progress: Progress) -> PackUpdate:
    """Blocking: run it in a worker thread."""
    packs = session.answers.packs
    if packs is None:
        raise PackDownloadError("this chat has no instruction pack store")
    # The session's upstream client: its URL and key (the embedded upstream's is made at
    # its start, not configured).
    update = download_pack(session.answers.upstream, session.settings.packs_dir / PACK_FILE,
                           progress=progress, allow_downgrade=session.settings.allow_downgrade)
    if update.changed:
        packs.reload()
        packs.prepare(session.cache.encoder)  # the semantic match follows in the background
    return update


def describe_update(update: PackUpdate) -> str:
    """The notice after F6."""
    manifest = update.manifest
    if not update.changed:
        return f"already up to date (pack {manifest.pack_id})"
    return f"pack {manifest.pack_id}: {manifest.count} instructions now answered on this device"


def describe_pack(stats: PackStats) -> str | None:
    """The stats screen's "pack version" line; None without a pack."""
    if stats.pack_id is None:
        return None
    return (f"{stats.pack_id} ({stats.entries} instructions, {stats.size_bytes:,} bytes, "
            f"{stats.hits} exact + {stats.semantic_hits} similar hits, {stats.rejected} "
            f"rejected, embeddings {stats.embedding})")
