"""A third-party OpenAI client, simonw's `llm` (its own openai-compatible model config,
unmodified), gets a cached answer from `meancache proxy` on its second, paraphrased
question."""

from collections.abc import Iterator
from pathlib import Path

import llm
import pytest
import yaml
from meancache.client.proxy.apps import key_digest
from meancache.client.proxy.partitions import Partition
from meancache.client.proxy.service import Proxy

from tests.client.test_proxy import MODEL, proxy_settings


@pytest.fixture
def proxy_url(tmp_path: Path, upstream_url: str) -> Iterator[tuple[str, Proxy]]:
    """The proxy in front of the real upstream (builtin:tiny, the session's)."""
    proxy = Proxy.open(proxy_settings(tmp_path, upstream_url))
    try:
        yield proxy.start(), proxy
    finally:
        proxy.close()


def test_llm_gets_a_cached_answer_to_a_paraphrase(proxy_url: tuple[str, Proxy],
                                                  tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    url, proxy = proxy_url
    home = tmp_path / "llm"
    home.mkdir()
    (home / "extra-openai-models.yaml").write_text(yaml.safe_dump([{
        "model_id": "meancache", "model_name": MODEL, "api_base": url,
        "headers": {"X-Meancache-App": "llm"}}]))
    monkeypatch.setenv("LLM_USER_PATH", str(home))
    model = llm.get_model("meancache")
    first = model.prompt("How do I bake sourdough bread at home?").text()
    second = model.prompt("How can I bake sourdough bread at home?").text()
    assert second == first  # and the entry counts the hit (below)
    # llm sends its placeholder key: the entries are that key's, labelled by its header
    partition = proxy.state.partitions.get(key_digest("DUMMY_KEY"), ())
    assert isinstance(partition, Partition)
    (entry,) = partition.cache.entries()
    assert entry.hits == 1 and entry.asked_by == "llm"
