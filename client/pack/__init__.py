"""The device side of instruction packs: download (client/pack/download.py) and the
lookup before the semantic cache (client/pack/store.py)."""

from meancache.client.pack.download import DEFAULT_MAX_PACK_BYTES, PackUpdate, download_pack
from meancache.client.pack.store import PackHit, PackStats, PackStore

__all__ = ["DEFAULT_MAX_PACK_BYTES", "PackHit", "PackStats", "PackStore", "PackUpdate",
           "download_pack"]
