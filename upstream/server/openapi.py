"""GET /openapi.json: the API's OpenAPI 3.1 description, its request bodies taken from the
pydantic models the server validates them with (request_models), so the published schema
and the checks cannot drift apart."""

from typing import Any

from meancache.shared.pml import PML_MEDIA_TYPE
from meancache.shared.pml.marks import (
    MARKS_PATTERN,
    MAX_HEADER_CHARS,
    MAX_MARKS,
    MODULES_HEADER,
)
from meancache.upstream.server.request_models import (
    ChatCompletionRequest,
    ErrorResponse,
    SchemaUpload,
)
from pydantic.json_schema import models_json_schema

REF = "#/components/schemas/{model}"


# Modules without writing PML (shared.pml.marks): the messages a request marks to keep.
MARKS_PARAMETER = {
    "name": MODULES_HEADER, "in": "header", "required": False,
    "description": (
        "Messages to keep as Prompt Cache modules (an app's system prompt, an attached "
        "document), as comma-separated indices into `messages`: the marked messages are "
        "laid out first, each at its own positions, and a later request of the same key "
        "that marks the same text reads its states back after any history. At most "
        f"{MAX_MARKS} indices, none twice, none past the messages and never the last "
        "(the question); not with a PML `<prompt>`. Anything else is a 400 naming this "
        "header. Other OpenAI-compatible servers ignore it."),
    "schema": {"type": "string", "maxLength": MAX_HEADER_CHARS, "pattern": MARKS_PATTERN},
    "example": "0,2"}


def _answers(ok: str, *errors: int) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": REF.format(
        model="ErrorResponse")}}}}
    answers: dict[str, Any] = {ok: {"description": "success"}}
    for status in (*errors, 500):
        answers[str(status)] = {"description": "error (OpenAI's error shape)", **error}
    return answers


def _json_body(model: str, *more: tuple[str, dict[str, Any]]) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": REF.format(model=model)}}}
    content.update(dict(more))
    return {"required": True, "content": content}


def openapi_document(title: str, secured: bool) -> dict[str, Any]:
    _, schemas = models_json_schema(
        [(m, "validation") for m in (ChatCompletionRequest, SchemaUpload, ErrorResponse)],
        ref_template=REF)
    name = {"name": "name", "in": "path", "required": True, "schema": {"type": "string",
                                                                        "maxLength": 128}}
    auth = [{"bearer": []}] if secured else []
    paths = {
        "/v1/chat/completions": {"post": {
            "summary": "chat completion (PML prompts reuse precomputed modules)",
            "parameters": [MARKS_PARAMETER],
            "requestBody": _json_body("ChatCompletionRequest"),
            "responses": _answers("200", 400, 401, 404, 413, 415, 429, 503)}},
        "/v1/models": {"get": {"summary": "the served model",
                               "responses": _answers("200", 401)}},
        "/v1/schemas": {
            "get": {"summary": "this key's schemas", "responses": _answers("200", 401)},
            "post": {"summary": "register a PML schema", "requestBody": _json_body(
                "SchemaUpload", (PML_MEDIA_TYPE, {"schema": {"type": "string"}})),
                "responses": _answers("201", 400, 401, 409, 413, 415, 429)}},
        "/v1/schemas/{name}": {
            "get": {"parameters": [name], "responses": _answers("200", 401, 404)},
            "delete": {"parameters": [name], "responses": _answers("200", 401, 404)}},
        "/v1/packs/latest": {"get": {"responses": _answers("200", 401, 404)}},
        "/v1/packs/latest/manifest": {"get": {"responses": _answers("200", 401, 404)}},
        "/health": {"get": {"security": [], "responses": _answers("200")}},
        "/metrics": {"get": {"responses": _answers("200", 401, 403)}},
    }
    document: dict[str, Any] = {
        "openapi": "3.1.0", "info": {"title": title, "version": "1"}, "paths": paths,
        "components": {"schemas": schemas.get("$defs", {})}, "security": auth}
    if secured:
        document["components"]["securitySchemes"] = {"bearer": {"type": "http",
                                                                 "scheme": "bearer"}}
    return document
