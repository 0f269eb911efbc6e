"""The chat's embedded upstream: the upstream server on a loopback thread, started for
the client when no upstream URL is configured. It lives here, above both sides, because
the client never imports the upstream."""

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from meancache.client.chat.session import EmbeddedUpstream
    from meancache.shared.progress import Progress


def start_embedded_upstream(model: str, data_dir: Path, progress: "Progress | None" = None
                            ) -> "EmbeddedUpstream":
    """Load ``model`` (built-ins converted once into ``data_dir``, ``progress`` hearing the
    steps) and serve it on a free loopback port, to holders of a key made for this run
    (blocking: seconds, a minute or more on a first conversion)."""
    from meancache.upstream.server.serve import BackgroundServer, private_settings

    # float32: fp16-int8 would put the chat over its memory target (upstream.precision)
    return BackgroundServer(model, private_settings(), data_dir=data_dir,
                            progress=progress).start()
