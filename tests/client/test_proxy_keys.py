"""Requests without a Bearer key (issue 38, finding 5): refused with a 401 that says what
was wrong once ``proxy_apps`` names any key; without it, one namespace that every such
request shares, which the proxy warns of when it starts (log file and console). Against
the real upstream on loopback."""

import logging
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from meancache.client.config import Settings, load_settings
from meancache.client.proxy.service import Proxy

from meancache.cli import main
from tests.support.servers import free_port, running_upstream

QUESTION = "How do I bake sourdough bread at home?"


@pytest.fixture(scope="module")
def upstream() -> Iterator[str]:
    with running_upstream() as url:
        yield url


def settings_for(data: Path, upstream: str, **overrides: Any) -> Settings:
    return load_settings(data / "config", data / "data", environ={}, encoder_model="minilm",
                         encoder_backend="torch", upstream_url=upstream, answer_max_tokens=8,
                         explore_rate=0.0, **overrides)


def ask(url: str, authorization: str | None) -> httpx.Response:
    headers = {} if authorization is None else {"Authorization": authorization}
    return httpx.post(f"{url}/chat/completions", headers=headers, timeout=120, json={
        "model": "builtin:tiny", "messages": [{"role": "user", "content": QUESTION}]})


@pytest.mark.parametrize(("authorization", "said"), [
    (None, "no API key"),
    ("Basic c2stZWRpdG9yOg==", "uses the 'Basic' scheme"),
    ("Bearer", "the Bearer key is empty"),
    ("Bearer sk-stranger", "unknown API key"),
])
def test_with_keys_configured_a_request_without_one_is_refused_saying_why(
        upstream: str, tmp_path: Path, authorization: str | None, said: str) -> None:
    proxy = Proxy.open(settings_for(tmp_path, upstream, proxy_apps={"editor": "sk-editor"}))
    try:
        url = proxy.start()
        refused = ask(url, authorization)
        assert refused.status_code == 401, refused.text
        error = refused.json()["error"]
        assert said in error["message"] and "Authorization: Bearer KEY" in error["message"]
        assert error["type"] == "authentication_error"
        assert ask(url, "Bearer sk-editor").status_code == 200
    finally:
        proxy.close()


def test_without_keys_keyless_requests_share_one_namespace_and_the_start_warns(
        upstream: str, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING, "meancache.client.proxy.service"):
        proxy = Proxy.open(settings_for(tmp_path, upstream))
    warned = [r.getMessage() for r in caplog.records if "no proxy_apps" in r.getMessage()]
    assert len(warned) == 1 and "share one cache" in warned[0]
    try:
        url = proxy.start()
        assert ask(url, None).headers["x-meancache"] == "miss"
        assert ask(url, "Basic dXNlcjpwYXNz").headers["x-meancache"].startswith("hit")
        assert ask(url, "Bearer some-key").headers["x-meancache"] == "miss"  # its own
    finally:
        proxy.close()


def test_the_console_banner_and_the_log_file_carry_the_warning(
        upstream: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """`meancache proxy` as run, up to the point where it would serve."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setenv("MEANCACHE_ENCODER_MODEL", "minilm")
    monkeypatch.setenv("MEANCACHE_ENCODER_BACKEND", "torch")
    def close_instead(self: Proxy, listener: socket.socket) -> None:
        listener.close()
        self.close()

    monkeypatch.setattr(Proxy, "serve", close_instead)
    assert main(["--data-dir", str(tmp_path / "data"), "proxy", "--port", str(free_port()),
                 "--upstream", upstream]) == 0
    console = " ".join(capsys.readouterr().err.split())
    assert "warning: no proxy_apps are configured" in console
    log = (tmp_path / "data" / "logs" / "meancache.log").read_text()
    assert log.count("no proxy_apps are configured") == 1
