"""Serving the FL server's HTTP apps (the global-model endpoint and the Fleet gateway) from
one process, over HTTPS when given certificates."""

import asyncio
import socket
from pathlib import Path

import uvicorn
from meancache.shared.http_limits import listener_config
from starlette.types import ASGIApp


def tls_options(certificates: Path | None) -> dict[str, str]:
    """uvicorn's TLS settings from a deploy/make-certificates.sh directory."""
    if certificates is None:
        return {}
    return {"ssl_certfile": str(certificates / "server.pem"),
            "ssl_keyfile": str(certificates / "server.key")}


def serve(apps: list[tuple[ASGIApp, socket.socket]], certificates: Path | None) -> None:
    """Serve every (app, listener) in the foreground until stopped (each listener from
    shared.http_limits.listening_socket, taken before anything starts)."""
    servers = [(uvicorn.Server(listener_config(app, listener, **tls_options(certificates))),
                listener) for app, listener in apps]

    async def all_of_them() -> None:
        await asyncio.gather(*(server.serve(sockets=[listener])
                               for server, listener in servers))

    asyncio.run(all_of_them())
