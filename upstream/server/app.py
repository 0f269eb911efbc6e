"""The Starlette application: routes, auth, limits and the mapping of errors to 4xx."""

import contextlib
import json
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import Any

from meancache.shared.pml import PMLError, UnknownSchemaError
from meancache.upstream.errors import PromptTooLongError, UpstreamError
from meancache.upstream.prompt_cache.engine import Delta, Finish, PromptCacheEngine
from meancache.upstream.server.metrics import ServerMetrics
from meancache.upstream.server.wire import BadRequest, Completion, error_body, parse_chat_request
from meancache.upstream.server.worker import ModelWorker
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    default_max_tokens: int = 256


class HTTPError(Exception):
    def __init__(self, status: int, message: str, kind: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code


Handler = Callable[[Request], Awaitable[Response]]


def _error_response(exc: Exception) -> JSONResponse:
    if isinstance(exc, HTTPError):
        status, kind, code = exc.status, exc.kind, exc.code
    elif isinstance(exc, UnknownSchemaError):
        status, kind, code = 404, "invalid_request_error", "schema_not_found"
    elif isinstance(exc, PMLError):
        status, kind, code = 400, "invalid_request_error", "invalid_pml"
    elif isinstance(exc, PromptTooLongError):
        status, kind, code = 400, "invalid_request_error", "context_length_exceeded"
    elif isinstance(exc, BadRequest | UpstreamError):
        status, kind, code = 400, "invalid_request_error", None
    else:
        raise exc
    return JSONResponse(error_body(str(exc), kind, code), status_code=status)


def create_app(engine: PromptCacheEngine, settings: ServerSettings | None = None) -> Starlette:
    settings = settings or ServerSettings()
    worker = ModelWorker()
    metrics = ServerMetrics(engine)
    model_name = engine.loaded.name

    def endpoint(name: str, authenticated: bool = True) -> Callable[[Handler], Handler]:
        """Auth, error mapping and request counting around a route handler."""
        def wrap(handler: Handler) -> Handler:
            async def run(request: Request) -> Response:
                try:
                    if authenticated:
                        check_auth(request)
                    response = await handler(request)
                except Exception as exc:  # every expected error becomes a 4xx body
                    response = _error_response(exc)
                metrics.requests.labels(name, str(response.status_code)).inc()
                return response
            return run
        return wrap

    def check_auth(request: Request) -> None:
        if settings.api_key is None:
            return
        header = request.headers.get("authorization", "")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not secrets.compare_digest(token, settings.api_key):
            raise HTTPError(401, "missing or wrong API key (send 'Authorization: Bearer KEY')",
                            "authentication_error", "invalid_api_key")

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_body_bytes:
            raise HTTPError(413, f"request body over {settings.max_body_bytes} bytes",
                            "invalid_request_error", "request_too_large")
        body = b""
        async for chunk in request.stream():
            body += chunk
            if len(body) > settings.max_body_bytes:
                raise HTTPError(413, f"request body over {settings.max_body_bytes} bytes",
                                "invalid_request_error", "request_too_large")
        return body

    async def read_json(request: Request) -> Any:
        body = await read_body(request)
        try:
            return json.loads(body)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise BadRequest(f"the request body is not valid JSON: {exc}") from None

    @endpoint("chat")
    async def chat(request: Request) -> Response:
        chat_request = parse_chat_request(await read_json(request), settings.default_max_tokens)
        prepared = await worker.call(lambda: engine.prepare_messages(chat_request.messages))
        engine.check_fits(prepared, chat_request.params)
        completion = Completion(model_name)

        def run(cancel: Any) -> Any:
            return engine.generate(prepared, chat_request.params, cancel)

        if not chat_request.stream:
            text, finish = "", None
            async for event in worker.stream(run):
                if isinstance(event, Delta):
                    text += event.text
                    if await request.is_disconnected():
                        break
                else:
                    finish = event
            if finish is None:  # the client left; the worker was told to stop
                metrics.cancelled.inc()
                return Response(status_code=499)
            metrics.completed(finish)
            return JSONResponse(completion.whole(text, finish))

        async def sse() -> AsyncIterator[str]:
            yield _sse(completion.chunk({"role": "assistant", "content": ""}))
            finished = False
            try:
                async for event in worker.stream(run):
                    if isinstance(event, Delta):
                        yield _sse(completion.chunk({"content": event.text}))
                    elif isinstance(event, Finish):
                        finished = True
                        metrics.completed(event)
                        yield _sse(completion.chunk({}, event))
                        if chat_request.include_usage:
                            yield _sse(completion.usage_chunk(event))
                yield "data: [DONE]\n\n"
            except UpstreamError as exc:
                yield _sse(error_body(str(exc), "server_error"))
            finally:
                if not finished:
                    metrics.cancelled.inc()
                    log.info("client left mid-stream; generation stopped")

        return StreamingResponse(sse(), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})

    @endpoint("models")
    async def models(request: Request) -> Response:
        loaded = engine.loaded
        return JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "meancache",
            "meancache": {
                "untrained": loaded.untrained, "architecture": loaded.architecture,
                "parameters": loaded.parameters, "context_length": loaded.context_length,
                "description": "randomly initialised demo model: its text is meaningless"
                if loaded.untrained else "local model",
            },
        }]})

    @endpoint("schemas")
    async def add_schema(request: Request) -> Response:
        body = await read_body(request)
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                payload = json.loads(body)
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                raise BadRequest(f"the request body is not valid JSON: {exc}") from None
            if not isinstance(payload, dict) or not isinstance(payload.get("schema"), str):
                raise BadRequest("send the PML as text, or JSON {\"schema\": \"<schema ...>\"}")
            source = payload["schema"]
        else:
            try:
                source = body.decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest("the schema is not UTF-8 text") from None
        info = await worker.call(lambda: engine.add_schema(source))
        return JSONResponse(_schema_json(info), status_code=201)

    @endpoint("schemas")
    async def list_schemas(request: Request) -> Response:
        infos = [engine.schema_info(name) for name in engine.registry.list()]
        return JSONResponse({"object": "list", "data": [_schema_json(i) for i in infos]})

    @endpoint("schemas")
    async def get_schema(request: Request) -> Response:
        return JSONResponse(_schema_json(engine.schema_info(request.path_params["name"])))

    @endpoint("schemas")
    async def delete_schema(request: Request) -> Response:
        name = request.path_params["name"]
        await worker.call(lambda: engine.remove_schema(name))
        return JSONResponse({"id": name, "deleted": True})

    @endpoint("health", authenticated=False)
    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_name, "queued": worker.queued})

    @endpoint("metrics")
    async def metrics_route(request: Request) -> Response:
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    async def not_found(request: Request, exc: Exception) -> Response:
        return JSONResponse(error_body(f"no route {request.method} {request.url.path}",
                                       "invalid_request_error", "not_found"), status_code=404)

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/v1/schemas", add_schema, methods=["POST"]),
        Route("/v1/schemas", list_schemas, methods=["GET"]),
        Route("/v1/schemas/{name}", get_schema, methods=["GET"]),
        Route("/v1/schemas/{name}", delete_schema, methods=["DELETE"]),
        Route("/health", health, methods=["GET"]),
        Route("/metrics", metrics_route, methods=["GET"]),
    ]
    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        worker.close()

    app = Starlette(routes=routes, exception_handlers={404: not_found}, lifespan=lifespan)
    app.state.engine = engine
    app.state.metrics = metrics
    return app


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _schema_json(info: Any) -> dict[str, Any]:
    data = asdict(info)
    data["encode_ms"] = round(data.pop("encode_seconds") * 1000, 3)
    data["id"] = data.pop("name")
    return data
