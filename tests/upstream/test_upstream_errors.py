"""The upstream API's exception handlers: every failure is an OpenAI-style JSON error,
counted per route, and an unexpected one never shows the client its traceback."""

from collections.abc import Iterator

import pytest
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.server.app import ServerSettings, create_app
from starlette.testclient import TestClient

KEY = "test-key"


@pytest.fixture(scope="module")
def engine() -> PromptCacheEngine:
    return PromptCacheEngine(load_model("builtin:tiny"), 64 << 20)


@pytest.fixture
def client(engine: PromptCacheEngine) -> Iterator[TestClient]:
    app = create_app(engine, ServerSettings(api_key=KEY))
    # Starlette re-raises an unhandled error after answering it, for the server to log.
    with TestClient(app, raise_server_exceptions=False,
                    headers={"Authorization": f"Bearer {KEY}"}) as c:
        yield c


def requests_counted(client: TestClient, endpoint: str, status: int) -> float:
    series = f'meancache_upstream_requests_total{{endpoint="{endpoint}",status="{status}"}} '
    lines = [line for line in client.get("/metrics").text.splitlines()
             if line.startswith(series)]
    return float(lines[0].split()[-1]) if lines else 0.0


def test_an_unexpected_error_is_a_generic_json_500(client: TestClient,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(name: str) -> None:
        raise RuntimeError("secret internal detail")

    monkeypatch.setattr(client.app.state.engine, "schema_info", broken)
    response = client.get("/v1/schemas/manual")
    assert response.status_code == 500
    error = response.json()["error"]
    assert error["type"] == "server_error"
    assert "secret" not in response.text and "Traceback" not in response.text
    assert "try again" in error["message"]
    assert requests_counted(client, "schemas", 500) == 1


def test_a_wrong_method_is_a_json_405_that_names_the_allowed_ones(client: TestClient) -> None:
    response = client.put("/v1/models")
    assert response.status_code == 405
    allowed = response.headers["allow"]
    assert set(allowed.split(", ")) == {"GET", "HEAD"}
    assert response.json()["error"]["message"] == f"PUT is not allowed on /v1/models; use {allowed}"


def test_a_missing_key_is_a_401_counted_under_its_route(client: TestClient) -> None:
    response = client.get("/v1/models", headers={"Authorization": ""})
    assert response.status_code == 401
    assert response.json()["error"] == {
        "message": "missing or wrong API key: send the header 'Authorization: Bearer KEY' "
                   "with the server's key",
        "type": "authentication_error", "param": None, "code": "invalid_api_key"}
    assert requests_counted(client, "models", 401) == 1
    assert client.get("/health", headers={"Authorization": ""}).status_code == 200


def test_an_unknown_schema_is_a_404_with_its_code(client: TestClient) -> None:
    response = client.get("/v1/schemas/nope")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "schema_not_found"
    assert requests_counted(client, "schemas", 404) == 1
