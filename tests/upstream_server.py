"""A real upstream server on loopback for tests, stopped when the block ends."""

from collections.abc import Iterator
from contextlib import contextmanager

from meancache.shared.processes import free_port
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.serve import BackgroundServer

__all__ = ["free_port", "running_upstream"]


@contextmanager
def running_upstream(model: str = "builtin:tiny",
                     settings: ServerSettings | None = None) -> Iterator[str]:
    """Yields the base URL of a server running ``model`` until the block ends."""
    with BackgroundServer(model, settings) as server:
        yield server.url
