"""The SuperLink's public face: only the Fleet API (what SuperNodes call) is reachable from
other hosts. The Control API (`flwr run`: run submission, which makes every joined device
execute the submitted app) stays on loopback, where only the operator reaches it.

flwr 1.4x serves both APIs on one port and its open-source distribution has no login for
the Control API, so `meancache fl server` binds the SuperLink to loopback (its control
port) and serves this proxy on the public address. It forwards exactly the Fleet methods a
SuperNode calls, matched on the request's raw path as sent (no decoding, no dot-segment
resolution: ``/v1/fleet/../control/start-run`` is not ``/v1/fleet/`` anything), to the
SuperLink path of that method, and answers anything else with 403.

It also hands SuperNodes the operator's signature of the app they are asked to run: the
stock SuperLink drops ``verifications`` of a locally submitted FAB, so the gateway puts the
signature kept for that FAB's digest (`meancache fl sign-app`, shared.fl.app_signing) into
each GetFab answer. A FAB nobody signed goes out without one, and a SuperNode started with
``--trusted-entities`` (every `meancache fl join`) refuses to run it.

A run's overrides (``flwr run --run-config``) travel beside the FAB, outside its signature,
and a SuperNode applies them unchecked (flwr/supernode/start_client_internal.py fuses the
FAB's config with ``Run.override_config`` from GetRun; the ServerApp reads the same fused
config). So the settings devices read and the server's that shape what devices receive
(shared.fl.run_config.SIGNED_KEYS) come only from the signed app (`fl run` and `fl
sign-app` write them into it), and the gateway hands a signature only to a GetFab whose run
it has seen, in a GetRun answer it forwarded, override none of them: a run that does, or
one it has not seen (the SuperNode asks GetRun first), gets its app unsigned, which every
`fl join` device refuses (a lab's --allow-unsigned-apps device runs it, as any app).
"""

import hashlib
import logging
import ssl
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx
from flwr.proto.fab_pb2 import GetFabRequest, GetFabResponse
from flwr.proto.run_pb2 import GetRunResponse
from google.protobuf.message import DecodeError
from meancache.shared.fl.app_signing import find_signature
from meancache.shared.fl.run_config import SIGNED_KEYS
from meancache.shared.http_limits import GuardRequests
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Scope

log = logging.getLogger(__name__)

# The gRPC methods of flwr.proto.Fleet a SuperNode calls (flwr/supernode/fleet_http_client.py),
# and the path of each on the SuperLink's HTTP transport.
FLEET_METHODS: dict[str, str] = {
    "/flwr.proto.Fleet/RegisterNode": "/v1/fleet/register-node",
    "/flwr.proto.Fleet/ActivateNode": "/v1/fleet/activate-node",
    "/flwr.proto.Fleet/DeactivateNode": "/v1/fleet/deactivate-node",
    "/flwr.proto.Fleet/UnregisterNode": "/v1/fleet/unregister-node",
    "/flwr.proto.Fleet/SendNodeHeartbeat": "/v1/fleet/send-node-heartbeat",
    "/flwr.proto.Fleet/PullMessages": "/v1/fleet/pull-messages",
    "/flwr.proto.Fleet/PushMessages": "/v1/fleet/push-messages",
    "/flwr.proto.Fleet/GetRun": "/v1/fleet/get-run",
    "/flwr.proto.Fleet/GetFab": "/v1/fleet/get-fab",
    "/flwr.proto.Fleet/PushObject": "/v1/fleet/push-object",
    "/flwr.proto.Fleet/PullObject": "/v1/fleet/pull-object",
    "/flwr.proto.Fleet/ConfirmMessageReceived": "/v1/fleet/confirm-message-received",
}
_ROUTES = frozenset(FLEET_METHODS.values())
GET_FAB = FLEET_METHODS["/flwr.proto.Fleet/GetFab"]
GET_RUN = FLEET_METHODS["/flwr.proto.Fleet/GetRun"]
# Runs whose overrides the gateway has checked, newest last; the oldest are forgotten
# (a SuperNode asking for such an old run's app again gets it unsigned).
MAX_RUNS = 4096
# The largest Fleet request: a PushObject carries one array chunk (flwr splits arrays into
# 5 MB chunks, FLWR_PRIVATE_MAX_ARRAY_CHUNK_SIZE) plus its framing.
MAX_BODY_BYTES = 16 * 1024 * 1024
# How long the SuperLink may take to answer one call (a SuperNode's own timeout is 30 s).
UPSTREAM_TIMEOUT = httpx.Timeout(60.0, connect=10.0)
# Hop-by-hop and recomputed headers are not forwarded.
_DROP = frozenset({"host", "connection", "keep-alive", "transfer-encoding", "te", "trailer",
                   "upgrade", "proxy-authorization", "proxy-authenticate", "content-length"})
REFUSED = ("only the Fleet API (SuperNodes) is served on this port; runs are submitted on "
           "the FL server itself")


def _forwardable(headers: httpx.Headers | dict[str, str], *also: str) -> dict[str, str]:
    return {k: v for k, v in headers.items() if k.lower() not in _DROP | set(also)}


def fleet_route(scope: Scope) -> str | None:
    """The SuperLink path this request may be forwarded to, or None. The raw path must be
    one of the Fleet paths byte for byte, so a dot segment, a percent-escape (``%2e``,
    ``%2f``), a double slash or a query string never matches."""
    raw = scope.get("raw_path") or scope["path"].encode()
    if scope["method"] != "POST" or scope.get("query_string"):
        return None
    path = raw.decode("latin-1")
    return path if path in _ROUTES else None


def attach_signature(answer: bytes, signatures: Path) -> bytes:
    """A GetFab answer with the operator's signature of its FAB in ``verifications`` (as
    the SuperLink sent it when none is kept for that FAB)."""
    response = GetFabResponse()
    try:
        response.ParseFromString(answer)
    except DecodeError:
        return answer
    digest = hashlib.sha256(response.fab.content).hexdigest()
    signature = find_signature(signatures, digest)
    if signature is None:
        log.warning("no operator signature for the app %s (%s): SuperNodes will refuse it; "
                    "sign it with `meancache fl sign-app`", digest[:16], signatures)
        return answer
    response.fab.verifications.clear()
    response.fab.verifications.update(signature.verifications())
    return response.SerializeToString(deterministic=True)


def strip_signature(answer: bytes) -> bytes:
    """A GetFab answer with no ``verifications``: a SuperNode that trusts only signed
    apps refuses it."""
    response = GetFabResponse()
    try:
        response.ParseFromString(answer)
    except DecodeError:
        return answer
    response.fab.verifications.clear()
    return response.SerializeToString(deterministic=True)


class RunChecks:
    """Which runs override settings devices read or that shape what they receive
    (SIGNED_KEYS), as seen in the GetRun answers forwarded; only a run seen to override
    none of them gets its app signed."""

    def __init__(self, limit: int = MAX_RUNS) -> None:
        self.limit = limit
        self._unsigned: OrderedDict[int, list[str]] = OrderedDict()  # run -> keys

    def saw(self, answer: bytes) -> None:
        """Note the run of a GetRun answer and the signed settings it overrides."""
        response = GetRunResponse()
        try:
            response.ParseFromString(answer)
        except DecodeError:
            return
        run = response.run
        keys = sorted(SIGNED_KEYS & set(run.override_config))
        if keys:
            log.warning("run %d overrides %s (what devices read or receive) outside the "
                        "operator's signature of its app: SuperNodes get the app unsigned "
                        "and refuse it; write them into the signed app (`meancache fl "
                        "sign-app --run-config` and `meancache fl run` with the same ones)",
                        run.run_id, ", ".join(keys))
        self._unsigned[run.run_id] = keys
        self._unsigned.move_to_end(run.run_id)
        while len(self._unsigned) > self.limit:
            self._unsigned.popitem(last=False)

    def may_sign(self, request: bytes) -> bool:
        """Whether the app a GetFab request asks for may carry the operator's signature."""
        fab_request = GetFabRequest()
        try:
            fab_request.ParseFromString(request)
        except DecodeError:
            return False
        keys = self._unsigned.get(fab_request.run_id)
        if keys is None:
            log.warning("GetFab for run %d, whose overrides the gateway has not seen: its "
                        "app goes out unsigned", fab_request.run_id)
        return keys == []


def _error(message: str, status: int) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def _read_capped(request: Request) -> bytes | None:
    """The body, or None once it passes MAX_BODY_BYTES (never buffered beyond that)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        return None
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_BODY_BYTES:
            return None
    return bytes(body)


def create_gateway(superlink: str, root_certificate: Path | None, app_signatures: Path,
                   timeout: httpx.Timeout = UPSTREAM_TIMEOUT) -> Starlette:
    """A proxy to the SuperLink at ``superlink`` (HOST:PORT on loopback; https when
    ``root_certificate`` verifies it) that passes the Fleet API only, handing out the
    app signatures kept in ``app_signatures``; ``timeout`` bounds each call to the
    SuperLink."""
    scheme = "https" if root_certificate else "http"
    verify: ssl.SSLContext | bool = (ssl.create_default_context(cafile=str(root_certificate))
                                     if root_certificate else True)
    client = httpx.AsyncClient(base_url=f"{scheme}://{superlink}", verify=verify,
                               timeout=timeout)
    runs = RunChecks()

    async def forward(request: Request) -> Response:
        route = fleet_route(request.scope)
        if route is None:
            log.warning("refused %s %r from %s", request.method,
                        request.scope.get("raw_path", b"")[:200],
                        request.client.host if request.client else "?")
            return _error(REFUSED, 403)
        try:
            body = await _read_capped(request)
        except ClientDisconnect:
            return Response(status_code=499)
        if body is None:
            return _error(f"a Fleet request body may hold at most {MAX_BODY_BYTES} bytes", 413)
        try:
            answer = await client.post(route, content=body,
                                       headers=_forwardable(request.headers))
        except httpx.HTTPError as exc:
            log.warning("the SuperLink did not answer %s: %s", route, exc)
            return _error("the SuperLink is not reachable", 502)
        content = answer.content
        if route == GET_RUN and answer.status_code == 200:
            runs.saw(content)
        if route == GET_FAB and answer.status_code == 200:
            content = (attach_signature(content, app_signatures) if runs.may_sign(body)
                       else strip_signature(content))
        return Response(content, status_code=answer.status_code,  # decoded by httpx:
                        headers=_forwardable(answer.headers, "content-encoding"))

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await client.aclose()

    return Starlette(routes=[Route("/{path:path}", forward,
                                   methods=["GET", "POST", "PUT", "PATCH", "DELETE"])],
                     middleware=[Middleware(GuardRequests)], lifespan=lifespan)
