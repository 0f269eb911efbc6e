"""Tenants on the real server: PML schemas belong to the API key that registered them, and
each key's schemas are limited in number and tokens. Without keys there is one tenant."""

from collections.abc import Iterator

import httpx
import pytest
from meancache.shared.pml import PML_MEDIA_TYPE
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.limits import Limits

from tests.support.servers import running_upstream

OWNER, OTHER, SMALL = "key-of-owner", "key-of-other", "key-of-small"
LIMITS = Limits(max_schemas_per_key=2, max_schema_tokens_per_key=300)


def schema(name: str, module: str = "chapter", text: str = "How to fix a bicycle.") -> str:
    return f'<schema name="{name}"><module name="{module}">{text}</module></schema>'


def prompt(name: str, module: str = "chapter") -> dict[str, object]:
    pml = f'<prompt schema="{name}"><{module}/><user>How?</user></prompt>'
    return {"messages": [{"role": "user", "content": pml}], "max_tokens": 2}


@pytest.fixture
def base_url() -> Iterator[str]:
    """A server of its own for each test: the per-key quotas count what earlier tests
    registered, so a shared one would make a test's outcome depend on the order."""
    settings = ServerSettings(api_key=OWNER, api_keys=(OTHER, SMALL), limits=LIMITS)
    with running_upstream(settings=settings) as url:
        yield url


def as_key(base_url: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base_url, headers={"Authorization": f"Bearer {key}"},
                        timeout=60)


def add(client: httpx.Client, source: str) -> httpx.Response:
    return client.post("/v1/schemas", content=source,
                       headers={"Content-Type": PML_MEDIA_TYPE})


def ids(client: httpx.Client) -> list[str]:
    return [s["id"] for s in client.get("/v1/schemas").json()["data"]]


def test_another_key_can_neither_list_use_nor_delete_a_schema(base_url: str) -> None:
    with as_key(base_url, OWNER) as owner, as_key(base_url, OTHER) as other:
        assert add(owner, schema("manual")).status_code == 201
        assert add(owner, schema("secret-plans")).status_code == 201
        assert ids(other) == []
        looked_up = other.get("/v1/schemas/manual")
        used = other.post("/v1/chat/completions", json=prompt("manual"))
        deleted = other.delete("/v1/schemas/manual")
        for response in (looked_up, used, deleted):
            assert response.status_code == 404
            assert "secret-plans" not in response.text
        assert "unknown schema 'manual'" in used.json()["error"]["message"]
        assert ids(owner) == ["manual", "secret-plans"]
        assert owner.post("/v1/chat/completions", json=prompt("manual")).status_code == 200
        assert owner.delete("/v1/schemas/secret-plans").status_code == 200


def test_a_schema_of_the_same_name_from_another_key_replaces_nothing(base_url: str) -> None:
    with as_key(base_url, OWNER) as owner, as_key(base_url, OTHER) as other:
        assert add(owner, schema("shared-name", "intro")).status_code == 201
        assert add(other, schema("shared-name", "outro")).status_code == 201
        assert owner.get("/v1/schemas/shared-name").json()["modules"] == ["intro"]
        assert other.get("/v1/schemas/shared-name").json()["modules"] == ["outro"]
        # each key's prompt imports its own schema's modules, and only those
        assert other.post("/v1/chat/completions",
                          json=prompt("shared-name", "intro")).status_code == 400
        assert other.delete("/v1/schemas/shared-name").status_code == 200
        assert owner.post("/v1/chat/completions",
                          json=prompt("shared-name", "intro")).status_code == 200


def test_a_key_holds_a_limited_number_of_schemas_and_tokens(base_url: str) -> None:
    with as_key(base_url, SMALL) as small:
        assert add(small, schema("one")).status_code == 201
        assert add(small, schema("two")).status_code == 201
        refused = add(small, schema("three"))
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "quota_exceeded"
        assert "2 schemas" in refused.json()["error"]["message"]
        assert add(small, schema("two", text="Replaced text.")).status_code == 201
        assert small.delete("/v1/schemas/two").status_code == 200
        too_long = add(small, schema("long", text="word " * 400))
        assert too_long.status_code == 429
        assert "module tokens" in too_long.json()["error"]["message"]
        assert ids(small) == ["one"]


def test_without_keys_every_request_is_the_one_tenant() -> None:
    with running_upstream() as url, httpx.Client(base_url=url, timeout=60) as client:
        assert add(client, schema("manual")).status_code == 201
        with httpx.Client(base_url=url, timeout=60) as again:
            assert ids(again) == ["manual"]
            assert again.post("/v1/chat/completions", json=prompt("manual")).status_code == 200


def test_only_the_operators_key_reads_the_server_wide_metrics(base_url: str) -> None:
    """/metrics counts every tenant's requests: another tenant learns nothing of them."""
    with as_key(base_url, OTHER) as other, as_key(base_url, OWNER) as owner:
        other.get("/v1/models")
        refused = other.get("/metrics")
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "operator_only"
        assert "meancache_upstream_requests_total" not in refused.text
        shown = owner.get("/metrics")
        assert shown.status_code == 200
        assert "meancache_upstream_requests_total" in shown.text
