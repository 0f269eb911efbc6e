"""ASGI middleware of the API: the bearer-key check on a route, and the request counter."""

import secrets
from collections.abc import Callable

from meancache.upstream.errors import InvalidApiKeyError
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class RequireApiKey:
    """Route middleware: raises InvalidApiKeyError (a 401) unless the bearer key matches.

    It runs inside the app's exception handling, so the error gets the API's JSON body.
    """

    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.api_key = api_key

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        scheme, _, token = Headers(scope=scope).get("authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token, self.api_key):
            raise InvalidApiKeyError("missing or wrong API key: send the header "
                                     "'Authorization: Bearer KEY' with the server's key")
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
