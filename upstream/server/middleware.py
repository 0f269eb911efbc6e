"""ASGI middleware of the API: the Host, bearer-key and media-type checks on a route,
and the request counter."""

from collections.abc import Callable

from meancache.shared.hosts import host_name
from meancache.upstream.errors import (
    HostNotAllowedError,
    InvalidApiKeyError,
    UnsupportedMediaTypeError,
)
from meancache.upstream.server.tenants import Tenants, set_tenant
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Route middleware runs inside the app's exception handling, so each error it raises gets
# the API's JSON body.


class RequireApiKey:
    """Route middleware: raises InvalidApiKeyError (a 401) unless the bearer key is one of
    the server's, and records which tenant that key is."""

    def __init__(self, app: ASGIApp, tenants: Tenants) -> None:
        self.app = app
        self.tenants = tenants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        tenant = self.tenants.identify(token) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise InvalidApiKeyError("missing or wrong API key: send the header "
                                     "'Authorization: Bearer KEY' with the server's key")
        set_tenant(scope, tenant)
        await self.app(scope, receive, send)


class RequireHost:
    """Route middleware: raises HostNotAllowedError unless the Host header names one of
    ``names`` (see meancache.shared.hosts: a DNS-rebinding page sends its own)."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app = app
        self.names = names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        header = Headers(scope=scope).get("host", "")
        name = host_name(header)
        if name is None:
            raise HostNotAllowedError(f"the Host header {header[:100]!r} is not a host name "
                                      "with an optional port")
        if name not in self.names:
            raise HostNotAllowedError(
                f"this server answers only to {', '.join(sorted(self.names))}; the request "
                f"named {header[:100]!r} in its Host header")
        await self.app(scope, receive, send)


class RequireMediaType:
    """Route middleware: raises UnsupportedMediaTypeError (a 415) unless the body's
    Content-Type is one of ``types``; a web page can post text/plain or a form to any
    address without asking, but not these."""

    def __init__(self, app: ASGIApp, types: tuple[str, ...]) -> None:
        self.app = app
        self.types = types

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        declared = Headers(scope=scope).get("content-type", "")
        if declared.partition(";")[0].strip().lower() not in self.types:
            raise UnsupportedMediaTypeError(
                f"send the body as {' or '.join(self.types)} (with that Content-Type); "
                f"got {declared[:100]!r}")
        await self.app(scope, receive, send)


class CountRequests:
    """App middleware: counts each routed request by its route's label and final status.

    Requests that match no route are not counted (their path is whatever a client sent);
    an exception that escapes every handler counts as a 500.
    """

    def __init__(self, app: ASGIApp, count: Callable[[str, int], None],
                 labels: dict[object, str]) -> None:
        self.app = app
        self.count = count
        self.labels = labels  # route endpoint -> label; the router puts the endpoint in scope

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500

        async def send_status(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, send_status)
        finally:
            label = self.labels.get(scope.get("endpoint"))
            if label is not None:
                self.count(label, status)
