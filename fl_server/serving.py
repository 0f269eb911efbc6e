"""Serving the FL server's HTTP apps (the global-model endpoint and the Fleet gateway) from
one process, over HTTPS when given certificates."""

import asyncio
from pathlib import Path

import uvicorn
from meancache.shared.http_limits import server_config
from starlette.types import ASGIApp


def tls_options(certificates: Path | None) -> dict[str, str]:
    """uvicorn's TLS settings from a deploy/make-certificates.sh directory."""
    if certificates is None:
        return {}
    return {"ssl_certfile": str(certificates / "server.pem"),
            "ssl_keyfile": str(certificates / "server.key")}


def serve(apps: list[tuple[ASGIApp, int]], host: str, certificates: Path | None) -> None:
    """Serve every (app, port) on ``host`` in the foreground until stopped."""
    servers = [uvicorn.Server(server_config(app, host=host, port=port,
                                            **tls_options(certificates)))
               for app, port in apps]

    async def all_of_them() -> None:
        await asyncio.gather(*(server.serve() for server in servers))

    asyncio.run(all_of_them())
