"""The proxy marks an app's system messages as modules (shared.pml.marks): a meancache
upstream keeps them and reads them back for the app's next question, on the cached path
and on the bypass alike; a plain OpenAI-compatible upstream gets the request it would get
unmarked, body for body (the echo stub records what it was sent: only a recording stub can
show that)."""

from pathlib import Path
from typing import Any

import openai
from meancache.client.config import load_settings
from meancache.client.proxy.service import Proxy
from meancache.shared.pml.marks import MODULES_HEADER

from tests.support.servers import (
    ECHO_MODEL,
    echo_upstream,
    module_tokens,
    running_upstream,
)

SYSTEM = ("You are the help desk of a ferry company. The ferry leaves the north pier at "
          "seven and at noon; bicycles travel free on the first crossing of the day.")
MODEL = "builtin:tiny"


def open_proxy(data: Path, upstream: str) -> Proxy:
    return Proxy.open(load_settings(data / "config", data / "data", environ={},
                                    encoder_model="minilm", encoder_backend="torch",
                                    upstream_url=upstream, answer_max_tokens=8))


def ask(base_url: str, question: str, model: str = MODEL, **extra: Any) -> str:
    """The proxy's x-meancache header for one whole answer after the system prompt."""
    raw = openai.OpenAI(base_url=base_url, api_key="app", max_retries=0
                        ).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "system", "content": SYSTEM},
                               {"role": "user", "content": question}], **extra)
    raw.parse()
    return raw.headers["x-meancache"]


def test_a_meancache_upstream_reads_the_apps_system_prompt_back_as_a_module(
        tmp_path: Path) -> None:
    system_tokens = len(SYSTEM.encode())  # builtin:tiny's tokenizer is byte-level
    with running_upstream(MODEL) as upstream:
        proxy = open_proxy(tmp_path, upstream)
        try:
            url = proxy.start()
            assert ask(url, "When does the ferry leave?") == "miss"
            before = module_tokens(upstream)
            assert ask(url, "Do bicycles pay?") == "miss"  # another question: the upstream
            after = module_tokens(upstream)
            assert after - before >= system_tokens
            assert ask(url, "Is there a bar on board?", stop=["\n"]).startswith("bypass")
            assert module_tokens(upstream) - after >= system_tokens
        finally:
            proxy.close()


def test_a_plain_upstream_gets_the_ordinary_request(tmp_path: Path) -> None:
    """Body for body what an unmarked request carries; the one header it does not know
    is ignored (RFC 9110), as any OpenAI-compatible server does."""
    received: list[dict[str, Any]] = []
    headers: list[dict[str, str]] = []
    with echo_upstream(received, headers) as upstream:
        proxy = open_proxy(tmp_path, upstream)
        try:
            url = proxy.start()
            ask(url, "When does the ferry leave?", model=ECHO_MODEL)
            ask(url, "Is there a bar on board?", model=ECHO_MODEL, stop=["\n"])
        finally:
            proxy.close()
    messages = [{"role": "system", "content": SYSTEM}]
    cached_path, bypass = received
    assert cached_path["messages"] == [*messages, {"role": "user",
                                                   "content": "When does the ferry leave?"}]
    assert not [name for name in cached_path if "module" in name or "meancache" in name]
    assert bypass == {"model": ECHO_MODEL, "stop": ["\n"], "messages": [
        *messages, {"role": "user", "content": "Is there a bar on board?"}]}
    assert [h.get(MODULES_HEADER.lower()) for h in headers] == ["0", "0"]

