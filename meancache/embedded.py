"""The chat's embedded upstream: the upstream server on a loopback thread, started for
the client when no upstream URL is configured. It lives here, above both sides, because
the client never imports the upstream."""

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meancache.client.chat.session import EmbeddedUpstream


def start_embedded_upstream(model: str, data_dir: Path) -> "EmbeddedUpstream":
    """Load ``model`` (built-ins converted once into ``data_dir``) and serve it on a free
    loopback port (blocking: seconds, minutes on a first conversion)."""
    from meancache.upstream.server.serve import BackgroundServer

    return BackgroundServer(model, data_dir=data_dir).start()
