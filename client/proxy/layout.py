"""Where the proxy's caches live on disk, without loading any of them (`cache list` reads
them with no model loaded): ``DATA_DIR/proxy/NAMESPACE/PARTITION/`` holds ``cache/`` (a
SemanticCache), ``exchanges/`` (client/proxy/exchanges.py) and ``preamble.json`` (the
system messages its answers were made after; client/proxy/partitions.py)."""

from collections.abc import Iterator
from pathlib import Path

from meancache.client.config import Settings


def proxy_dir(settings: Settings) -> Path:
    return settings.data_dir / "proxy"


def cache_dirs(settings: Settings) -> Iterator[tuple[str, Path]]:
    """(namespace, cache directory) of every proxy cache on disk."""
    root = proxy_dir(settings)
    for directory in sorted(root.glob("*/*/cache")) if root.is_dir() else ():
        yield directory.parent.parent.name, directory
