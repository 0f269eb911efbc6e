"""The chat's embedded upstream: the upstream server on a loopback thread, started for
the client when no upstream URL is configured. It lives here, above both sides, because
the client never imports the upstream."""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meancache.client.chat.session import EmbeddedUpstream


def start_embedded_upstream(model: str) -> "EmbeddedUpstream":
    """Load ``model`` and serve it on a free loopback port (blocking: seconds)."""
    from meancache.upstream.server.serve import BackgroundServer

    return BackgroundServer(model).start()
