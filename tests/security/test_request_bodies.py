"""The upstream's request bodies against its published schema (issue 26, item 6), on the
real server on loopback: /openapi.json describes every body the server takes, each body is
checked against the same pydantic model, and whatever a caller sends (bodies drawn from
the schema, and arbitrary JSON) gets a 2xx or a 4xx in OpenAI's error shape, never a 5xx."""

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema
from meancache.shared.loopback_server import LoopbackServer
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.server.app import ServerSettings, create_app

from tests.support.fuzz import JSON, fuzzed

KEY = "key-of-the-fuzzer"
FUZZ = fuzzed(max_examples=40)
SEEN: dict[str, int] = {}  # status classes per surface, for the report


@pytest.fixture(scope="module")
def upstream() -> Iterator[httpx.Client]:
    engine = PromptCacheEngine(load_model("builtin:tiny"), 64 << 20)
    server = LoopbackServer(create_app(engine, ServerSettings(api_key=KEY)), "upstream")
    assert server.start()
    with httpx.Client(base_url=server.url, timeout=60,
                      headers={"Authorization": f"Bearer {KEY}"}) as client:
        yield client
    server.stop()
    print(f"\nrequests by surface and status class: {SEEN}")  # shown with -s


@pytest.fixture(scope="module")
def published(upstream: httpx.Client) -> dict[str, Any]:
    answer = upstream.get("/openapi.json")
    assert answer.status_code == 200
    return dict(answer.json())


def chat_schema(published: dict[str, Any]) -> dict[str, Any]:
    """The chat body's schema, self-contained (its $refs point into components)."""
    schemas = published["components"]["schemas"]
    text = json.dumps(schemas["ChatCompletionRequest"]).replace("#/components/schemas/",
                                                                "#/$defs/")
    return {**json.loads(text), "$defs": json.loads(json.dumps(schemas).replace(
        "#/components/schemas/", "#/$defs/"))}


def answered(response: httpx.Response, surface: str) -> None:
    """2xx, or 4xx in OpenAI's error shape; never a 5xx."""
    SEEN[f"{surface} {response.status_code // 100}xx"] = SEEN.get(
        f"{surface} {response.status_code // 100}xx", 0) + 1
    assert response.status_code < 500, response.text[:500]
    if response.status_code >= 400:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert set(error) == {"message", "type", "param", "code"}


def test_the_schema_is_published_with_every_body_the_server_takes(
        published: dict[str, Any]) -> None:
    assert published["openapi"].startswith("3.")
    chat = published["paths"]["/v1/chat/completions"]["post"]
    assert chat["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith(
        "/ChatCompletionRequest")
    body = published["components"]["schemas"]["ChatCompletionRequest"]
    assert body["additionalProperties"] is False and "messages" in body["required"]
    assert {"stream", "temperature", "top_p", "repetition_penalty"} <= set(body["properties"])
    assert "SchemaUpload" in published["components"]["schemas"]


@pytest.mark.parametrize(("body", "param"), [
    ({"metadata": 5}, "metadata"),  # a label of the wrong type was taken
    ({"user": ["a"]}, "user"),
    ({"seed": 2**64}, "seed"),  # 20 digits: under the number cap, over int64
    ({"max_tokens": 2**64}, "max_tokens"),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
     "messages.0.content"),
    ({"stream": "false"}, "stream"),
])
def test_typed_fields_refuse_a_wrong_type_by_name(upstream: httpx.Client, body: dict[str, Any],
                                                  param: str) -> None:
    full = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **body}
    answer = upstream.post("/v1/chat/completions", json=full)
    assert answer.status_code == 400, answer.text
    answered(answer, "chat")
    assert answer.json()["error"]["param"].startswith(param)


def test_bodies_drawn_from_the_published_schema_never_get_a_5xx(
        upstream: httpx.Client, published: dict[str, Any]) -> None:
    @FUZZ
    @given(from_schema(chat_schema(published)))
    def check(body: dict[str, Any]) -> None:
        body = {**body, "max_tokens": min(int(body.get("max_tokens") or 2), 3)}
        body.pop("max_completion_tokens", None)
        answered(upstream.post("/v1/chat/completions", json=body), "chat (schema)")

    check()


def test_arbitrary_json_bodies_never_get_a_5xx(upstream: httpx.Client) -> None:
    messages = [{"role": "user", "content": "hi"}]

    @FUZZ
    @given(JSON, st.dictionaries(st.sampled_from(
        ["stream", "temperature", "top_p", "seed", "stop", "stream_options", "metadata",
         "messages", "model", "n", "tools", "logit_bias", "repetition_window"]), JSON,
        max_size=3))
    def check(whole: Any, fields: dict[str, Any]) -> None:
        answered(upstream.post("/v1/chat/completions", json=whole), "chat (any JSON)")
        body = {"messages": messages, "max_tokens": 2, **fields}
        answered(upstream.post("/v1/chat/completions", json=body), "chat (any field)")
        answered(upstream.post("/v1/schemas", json=whole), "schemas (any JSON)")

    check()
