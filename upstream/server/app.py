"""The Starlette application: routes, auth, limits; errors are answered by error_handlers."""

import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from meancache.shared.http_limits import GuardRequests, error_body
from meancache.shared.pml import PML_MEDIA_TYPE
from meancache.shared.pml.marks import MODULES_HEADER, parse_marks
from meancache.upstream.errors import (
    BadRequest,
    ClientGoneError,
    OperatorOnlyError,
    RequestTooLargeError,
    UpstreamError,
)
from meancache.upstream.prompt_cache.engine import Delta, Finish, PromptCacheEngine
from meancache.upstream.sampling_params import SERVER_DEFAULTS, SamplingParams
from meancache.upstream.server.error_handlers import exception_handlers
from meancache.upstream.server.limits import (
    Limits,
    check_chat,
    check_prompt,
    check_schema_usage,
    parse_json,
)
from meancache.upstream.server.metrics import ServerMetrics
from meancache.upstream.server.middleware import (
    CountRequests,
    RequireApiKey,
    RequireHost,
    RequireMediaType,
)
from meancache.upstream.server.openapi import openapi_document
from meancache.upstream.server.packs import pack_routes
from meancache.upstream.server.request_models import SchemaUpload
from meancache.upstream.server.tenants import Tenants, tenant_id, tenant_of
from meancache.upstream.server.wire import Completion, parse_chat_request
from meancache.upstream.server.worker import ModelWorker
from pydantic import ValidationError
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerSettings:
    api_key: str | None = None
    max_body_bytes: int = 4 * 1024 * 1024
    # What a request that sets none of these gets: its max_tokens, and the repetition
    # guard (upstream.sampling) that keeps small models out of loops.
    defaults: SamplingParams = SERVER_DEFAULTS
    api_keys: tuple[str, ...] = ()  # more keys; each key is a tenant with its own schemas
    allowed_hosts: frozenset[str] | None = None  # Host header names answered; None: any
    limits: Limits = field(default_factory=Limits)
    packs_dir: Path | None = None  # where instruction packs are published (None: none)


def create_app(engine: PromptCacheEngine, settings: ServerSettings | None = None) -> Starlette:
    settings = settings or ServerSettings()
    worker = ModelWorker(settings.limits.max_queued, settings.limits.max_queued_per_key)
    limits = settings.limits
    metrics = ServerMetrics(engine)
    model_name = engine.loaded.name

    too_large = (f"the request body is over {settings.max_body_bytes} bytes; send less "
                 "(or start the server with a larger --max-body-kb)")

    async def read_body(request: Request) -> bytes:
        declared = request.headers.get("content-length")
        if declared and declared.isdigit() and int(declared) > settings.max_body_bytes:
            raise RequestTooLargeError(too_large)
        body = b""
        try:
            async for chunk in request.stream():
                body += chunk
                if len(body) > settings.max_body_bytes:
                    raise RequestTooLargeError(too_large)
        except ClientDisconnect:
            raise ClientGoneError("the client closed the connection mid-request") from None
        return body

    async def read_json(request: Request) -> Any:
        return parse_json(await read_body(request), limits)

    async def chat(request: Request) -> Response:
        tenant = tenant_of(request)
        worker.admit(tenant)  # a key with its queue full costs no body read or parse
        chat_request = parse_chat_request(await read_json(request), settings.defaults,
                                          model_name)
        check_chat(chat_request, limits)
        marks = request.headers.get(MODULES_HEADER)
        marked = parse_marks(marks, len(chat_request.messages)) if marks is not None else ()
        completion = Completion(model_name)

        def run(cancel: Any) -> Any:
            # One job, one turn: preparing the prompt and generating as two jobs would let
            # another key's request run in between, doubling what a greedy key costs others.
            prepared = (engine.prepare_marked(chat_request.messages, marked, tenant) if marked
                        else engine.prepare_messages(chat_request.messages, tenant))
            check_prompt(prepared, limits)
            engine.check_fits(prepared, chat_request.params)
            return engine.generate(prepared, chat_request.params, cancel)

        events = worker.stream(run, tenant)
        try:  # a prompt that is refused is a 4xx before any answer starts
            first = await anext(events)
        except StopAsyncIteration:
            first = None

        async def all_events() -> AsyncIterator[Any]:
            try:
                if first is not None:
                    yield first
                    async for event in events:
                        yield event
            finally:  # a client gone: the model thread stops at its next token
                await events.aclose()

        if not chat_request.stream:
            text, finish = "", None
            async for event in all_events():
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
                async for event in all_events():
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

    async def models(request: Request) -> Response:
        loaded = engine.loaded
        return JSONResponse({"object": "list", "data": [{
            "id": model_name, "object": "model", "created": 0, "owned_by": "meancache",
            "meancache": {
                "untrained": loaded.untrained, "architecture": loaded.architecture,
                "parameters": loaded.parameters, "context_length": loaded.context_length,
                "precision": loaded.precision,
                "description": "randomly initialised demo model: its text is meaningless"
                if loaded.untrained else "local model",
            },
        }]})

    async def add_schema(request: Request) -> Response:
        tenant = tenant_of(request)
        worker.admit(tenant)
        body = await read_body(request)
        if request.headers.get("content-type", "").startswith("application/json"):
            try:
                source = SchemaUpload.model_validate(parse_json(body, limits)).pml
            except ValidationError:
                raise BadRequest(f"send the PML as {PML_MEDIA_TYPE}, or JSON "
                                 "{\"schema\": \"<schema ...>\"}") from None
        else:
            try:
                source = body.decode("utf-8")
            except UnicodeDecodeError:
                raise BadRequest("the schema is not UTF-8 text; send it UTF-8 encoded") from None
        info = await worker.call(lambda: engine.add_schema(
            source, tenant, lambda usage: check_schema_usage(usage, limits)), tenant)
        return JSONResponse(_schema_json(info), status_code=201)

    # Schemas are read on the model thread, which alone changes them.
    async def list_schemas(request: Request) -> Response:
        tenant = tenant_of(request)
        infos = await worker.call(lambda: engine.schema_infos(tenant), tenant)
        return JSONResponse({"object": "list", "data": [_schema_json(i) for i in infos]})

    async def get_schema(request: Request) -> Response:
        name, tenant = request.path_params["name"], tenant_of(request)
        return JSONResponse(_schema_json(await worker.call(
            lambda: engine.schema_info(name, tenant), tenant)))

    async def delete_schema(request: Request) -> Response:
        name, tenant = request.path_params["name"], tenant_of(request)
        await worker.call(lambda: engine.remove_schema(name, tenant), tenant)
        return JSONResponse({"id": name, "deleted": True})

    tenants = Tenants((settings.api_key or "", *settings.api_keys))
    published = openapi_document(f"meancache upstream ({model_name})", bool(tenants))

    async def openapi(request: Request) -> Response:
        return JSONResponse(published)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok", "model": model_name, "queued": worker.queued})

    operator = tenant_id(settings.api_key) if settings.api_key else None

    async def metrics_route(request: Request) -> Response:
        # The totals count every tenant's traffic: with several keys only the first, the
        # operator's, may read them.
        if settings.api_keys and tenant_of(request) != operator:
            raise OperatorOnlyError("/metrics counts every key's requests: only the "
                                    "operator's key (the server's first) may read it")
        return Response(metrics.render(), media_type="text/plain; version=0.0.4")

    hosts = [Middleware(RequireHost, settings.allowed_hosts)] if settings.allowed_hosts else []
    auth = hosts + ([Middleware(RequireApiKey, tenants)] if tenants else [])
    json_body = [Middleware(RequireMediaType, ("application/json",))]
    schema_body = [Middleware(RequireMediaType, ("application/json", PML_MEDIA_TYPE))]
    routes = [  # the name is the endpoint label of the request counter
        Route("/v1/chat/completions", chat, methods=["POST"], name="chat",
              middleware=auth + json_body),
        Route("/v1/models", models, methods=["GET"], name="models", middleware=auth),
        Route("/v1/schemas", add_schema, methods=["POST"], name="schemas",
              middleware=auth + schema_body),
        Route("/v1/schemas", list_schemas, methods=["GET"], name="schemas", middleware=auth),
        Route("/v1/schemas/{name}", get_schema, methods=["GET"], name="schemas",
              middleware=auth),
        Route("/v1/schemas/{name}", delete_schema, methods=["DELETE"], name="schemas",
              middleware=auth),
        Route("/health", health, methods=["GET"], name="health", middleware=hosts),
        Route("/openapi.json", openapi, methods=["GET"], name="openapi", middleware=hosts),
        Route("/metrics", metrics_route, methods=["GET"], name="metrics", middleware=auth),
        *pack_routes(settings.packs_dir, auth),
    ]

    def count(label: str, status: int) -> None:
        metrics.requests.labels(label, str(status)).inc()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        worker.close()

    labels = {route.endpoint: route.name for route in routes}
    app = Starlette(routes=routes, exception_handlers=exception_handlers(), lifespan=lifespan,
                    middleware=[Middleware(GuardRequests),
                                Middleware(CountRequests, count, labels)])
    app.state.engine = engine
    app.state.metrics = metrics
    app.state.worker = worker
    return app


def _sse(data: dict[str, Any]) -> str:
    return f"data: {json.dumps(data, ensure_ascii=False)}\n\n"


def _schema_json(info: Any) -> dict[str, Any]:
    data = asdict(info)
    data["encode_ms"] = round(data.pop("encode_seconds") * 1000, 3)
    data["id"] = data.pop("name")
    return data
