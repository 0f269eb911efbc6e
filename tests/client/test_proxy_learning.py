"""The proxy learns where it may answer (issue 37): a near would-be hit is explored (the
fresh answer returned, the pair labelled), and ``GET /v1/meancache/stats`` reports each of
the app's caches' hit rate with the learned wrong rate and its bound beside it, to that
app alone and only with its key. Against the real upstream (builtin:tiny) on loopback;
exploration at rate 1 so that the test draws nothing by chance."""

from collections.abc import Iterator

import httpx
import pytest
from meancache.client.config import Settings
from meancache.client.proxy.service import Proxy

from tests.client.test_proxy import PARAPHRASE, QUESTION, proxy_settings

EDITOR, OTHER = "sk-editor", "sk-other"


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, upstream_url: str) -> Settings:
    return proxy_settings(tmp_path_factory.mktemp("proxy-learning"), upstream_url,
                          explore_rate=1.0, explore_width=1.0,
                          proxy_apps={"editor": EDITOR, "other": OTHER})


@pytest.fixture(scope="module")
def base_url(settings: Settings) -> Iterator[str]:
    proxy = Proxy.open(settings)
    try:
        yield proxy.start()
    finally:
        proxy.close()


def ask(base_url: str, question: str) -> httpx.Response:
    response = httpx.post(f"{base_url}/chat/completions", timeout=120,
                          headers={"Authorization": f"Bearer {EDITOR}"},
                          json={"model": "builtin:tiny",
                                "messages": [{"role": "user", "content": question}]})
    assert response.status_code == 200, response.text
    return response


def stats(base_url: str, key: str | None) -> httpx.Response:
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    return httpx.get(f"{base_url}/meancache/stats", headers=headers, timeout=60)


def test_a_would_be_hit_is_explored_labelled_and_counted_beside_the_wrong_rate(
        base_url: str) -> None:
    assert ask(base_url, QUESTION).headers["x-meancache"] == "miss"
    explored = ask(base_url, PARAPHRASE)
    assert explored.headers["x-meancache"] == "miss"  # the fresh answer, not the cached one
    body = explored.json()
    assert body["usage"]["completion_tokens"] > 0  # the upstream answered it
    assert body["meancache"]["source"] == "upstream"
    assert "checked" in body["meancache"]["declined"]
    assert "exploration" in body["meancache"]["declined"]
    assert ask(base_url, QUESTION).headers["x-meancache"].startswith("hit")  # identity
    report = stats(base_url, EDITOR)
    assert report.status_code == 200, report.text
    [cache] = report.json()["caches"]
    assert (cache["hits"], cache["misses"], cache["explored"]) == (1, 2, 1)
    assert report.json()["hit_rate"] == pytest.approx(1 / 3)
    assert cache["wrong_rate_labels"] == 1  # the explored pair, labelled
    assert cache["learns_from_answers"] is True  # an upstream named (upstream_url)
    assert cache["wrong_rate"] in (0.0, 1.0) and cache["max_wrong_rate"] == 0.02
    assert cache["wrong_rate"] <= cache["wrong_rate_upper"] <= 1.0
    # one wrong label of one closes the region (its lower limit is over 2%); a right one
    # leaves it open: the body says which, and from which score it serves
    closed = cache["wrong_rate"] == 1.0
    assert cache["closed"] is closed and (cache["serves_from"] is None) is closed
    assert (cache["wrong_rate_lower"] is not None) is closed
    # the warm-up (50 by default) checks every match: one checked so far, over the
    # threshold unless the region closed (then no score is over it)
    assert (cache["warmup"], cache["checked"], cache["checked_wrong"]) == (
        50, 0 if closed else 1, 0)


def test_stats_need_a_key_and_show_an_app_only_its_own_caches(base_url: str) -> None:
    ask(base_url, "How long should I boil an egg?")
    refused = stats(base_url, None)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert stats(base_url, "sk-stranger").status_code == 401
    other = stats(base_url, OTHER)
    assert other.status_code == 200 and other.json()["caches"] == []
    assert other.json()["hit_rate"] == 0.0
    mine = httpx.get(f"{base_url}//meancache/stats/", timeout=60,  # a normalised path
                     headers={"Authorization": f"Bearer {EDITOR}"})
    assert mine.status_code == 200 and mine.json()["caches"]
    posted = httpx.post(f"{base_url}/meancache/stats", timeout=60, json={},
                        headers={"Authorization": f"Bearer {EDITOR}"})
    assert posted.status_code == 405 and "GET" in posted.json()["error"]["message"]
