"""Starlette exception handlers: every error becomes the OpenAI-style JSON error body.

Our errors get the status :data:`meancache.upstream.errors.HTTP_ERRORS` names for their
class (Starlette picks the handler of the nearest class in the error's MRO); Starlette's
own HTTPExceptions (no route, wrong method) keep their status. Anything else is a JSON
500 with a generic message: Starlette re-raises it after the response, so the server
logs the traceback and the client never sees it.
"""

from collections.abc import Awaitable, Callable
from typing import Any

from meancache.shared.http_limits import error_body
from meancache.upstream.errors import HTTP_ERRORS, HTTPErrorKind
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

INTERNAL_ERROR = "the server failed on this request (its log has the details); try again"


def exception_handlers() -> dict[Any, Callable[[Request, Any], Awaitable[Response]]]:
    """The ``exception_handlers`` argument of the Starlette app."""
    handlers: dict[Any, Callable[[Request, Any], Awaitable[Response]]] = {
        cls: _answer(kind) for cls, kind in HTTP_ERRORS.items()
    }
    handlers[404] = _no_route
    handlers[HTTPException] = _http_exception
    handlers[Exception] = _internal_error
    return handlers


def _answer(kind: HTTPErrorKind) -> Callable[[Request, Exception], Awaitable[Response]]:
    async def answer(request: Request, exc: Exception) -> Response:
        return JSONResponse(error_body(str(exc), kind.type, kind.code,
                                       getattr(exc, "param", None)), status_code=kind.status)
    return answer


async def _no_route(request: Request, exc: Exception) -> Response:
    message = (f"no route {request.method} {request.url.path}; the API serves "
               "/v1/chat/completions, /v1/models, /v1/schemas, /health, /metrics and "
               "/openapi.json")
    return JSONResponse(error_body(message, "invalid_request_error", "not_found"),
                        status_code=404)


async def _http_exception(request: Request, exc: HTTPException) -> Response:
    message = exc.detail
    allowed = (exc.headers or {}).get("Allow")
    if allowed:
        message = f"{request.method} is not allowed on {request.url.path}; use {allowed}"
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    return JSONResponse(error_body(message, kind), status_code=exc.status_code,
                        headers=exc.headers)


async def _internal_error(request: Request, exc: Exception) -> Response:
    return JSONResponse(error_body(INTERNAL_ERROR, "server_error"), status_code=500)
