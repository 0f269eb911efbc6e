"""The SuperLink's public face: only the Fleet API (what SuperNodes call) is reachable from
other hosts. The Control API (`flwr run`: run submission, which makes every joined device
execute the submitted app) stays on loopback, where only the operator reaches it.

flwr 1.4x serves both APIs on one port and its open-source distribution has no login for
the Control API, so `meancache fl server` binds the SuperLink to loopback (its control
port) and serves this proxy on the public address: it forwards ``POST /v1/fleet/...`` and
answers anything else with 403.
"""

import logging
import ssl
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

log = logging.getLogger(__name__)

FLEET = "/v1/fleet/"
# Hop-by-hop and recomputed headers are not forwarded.
_DROP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
                   "upgrade", "proxy-authorization", "proxy-authenticate", "content-length"})
REFUSED = ("only the Fleet API (SuperNodes) is served on this port; runs are submitted on "
           "the FL server itself")


def _forwardable(headers: httpx.Headers | dict[str, str], *also: str) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP | set(also)}


def create_gateway(superlink: str, root_certificate: Path | None) -> Starlette:
    """A proxy to the SuperLink at ``superlink`` (HOST:PORT on loopback; https when
    ``root_certificate`` verifies it) that passes the Fleet API only."""
    scheme = "https" if root_certificate else "http"
    verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(root_certificate))
                                     if root_certificate else True)
    client = httpx.AsyncClient(base_url=f"{scheme}://{superlink}", verify=verify,
                               timeout=httpx.Timeout(None))

    async def forward(request: Request) -> Response:
        if request.method != "POST" or not request.url.path.startswith(FLEET):
            log.warning("refused %s %s from %s", request.method, request.url.path,
                        request.client.host if request.client else "?")
            return JSONResponse({"error": {"message": REFUSED}}, status_code=403)
        try:
            answer = await client.post(request.url.path, content=await request.body(),
                                       headers=_forwardable(request.headers))
        except httpx.HTTPError as exc:
            log.warning("the SuperLink did not answer %s: %s", request.url.path, exc)
            return JSONResponse({"error": {"message": "the SuperLink is not reachable"}},
                                status_code=502)
        return Response(answer.content, status_code=answer.status_code,  # decoded by httpx:
                        headers=_forwardable(answer.headers, "content-encoding"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=[Route("/{path:path}", forward,
                                   methods=["GET", "POST", "PUT", "PATCH", "DELETE"])],
                     lifespan=lifespan)
