"""The proxy's caches as the device's: at most ``MAX_OPEN`` open (the least recently used
closed, or once its last request is done; reopened on demand), all closed when the proxy
stops, and the device's global tau reaching them, open or made later. The upstream is
the real server running builtin:tiny (the session's); the encoder MiniLM. That a cache is closed is
seen as the process holding no file under its directory."""

import gc
import os
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from meancache.client.config import Settings
from meancache.client.device_caches import proxy_dir
from meancache.client.fl.device import DeviceState
from meancache.client.proxy import partitions
from meancache.client.proxy.apps import key_digest
from meancache.client.proxy.partitions import Partition
from meancache.client.proxy.service import Proxy
from meancache.shared.fl.bound_evidence import BoundEvidence

from tests.client.test_proxy import PARAPHRASE, QUESTION, ask, proxy_settings


def open_files(under: Path) -> int:
    """Files under ``under`` this process holds open (a closed cache's connections go
    with its last reference)."""
    gc.collect()
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        try:
            count += os.readlink(fd).startswith(f"{under}/")
        except OSError:  # closed since it was listed
            pass
    return count


@pytest.fixture
def settings(tmp_path: Path, upstream_url: str) -> Settings:
    return proxy_settings(tmp_path, upstream_url)


@pytest.fixture
def proxy(settings: Settings) -> Iterator[Proxy]:
    proxy = Proxy.open(settings)
    try:
        yield proxy
    finally:
        proxy.close()


def test_the_least_recently_used_cache_is_closed_and_reopens_on_demand(
        proxy: Proxy, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partitions, "MAX_OPEN", 2)
    url = proxy.start()
    keys = ("one", "two", "three")
    apps = {key: proxy_dir(settings) / key_digest(key) for key in keys}
    for key in keys:
        assert ask(url, QUESTION, key=key)[0] == "miss"
    assert open_files(apps["one"]) == 0  # the least recently used: closed
    assert open_files(apps["two"]) > 0 and open_files(apps["three"]) > 0
    assert ask(url, PARAPHRASE, key="one")[0].startswith("hit")  # reopened, entries kept
    assert open_files(apps["one"]) > 0
    assert open_files(apps["two"]) == 0  # now the least recently used
    proxy.close()
    assert open_files(proxy_dir(settings)) == 0  # all closed when the proxy stops


def test_a_cache_in_use_is_closed_only_when_its_request_is_done(
        proxy: Proxy, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(partitions, "MAX_OPEN", 1)
    caches = proxy.state.partitions
    used = caches.get(key_digest("one"), ())
    assert isinstance(used, Partition)
    other = caches.get(key_digest("two"), ())  # past MAX_OPEN: "one" is no longer kept
    assert isinstance(other, Partition)
    caches.release(other)
    used.cache.insert(QUESTION, "Bake it.")  # still usable by the request holding it
    assert used.cache.lookup(PARAPHRASE).answer == "Bake it."  # type: ignore[union-attr]
    assert open_files(proxy_dir(settings) / key_digest("one")) > 0
    caches.release(used)
    del used
    assert open_files(proxy_dir(settings) / key_digest("one")) == 0
    again = caches.get(key_digest("one"), ())
    assert isinstance(again, Partition) and len(again.cache) == 1
    caches.release(again)


def test_the_devices_global_tau_reaches_open_caches_and_those_made_later(
        proxy: Proxy, settings: Settings) -> None:
    """What `fl sync` and a federated round do (DeviceState.set_global_threshold) reaches
    a proxy cache that is open, and one made afterwards starts from it; each keeps its
    own local tau. The error-bound evidence they install (set_pooled_bound) reaches a
    cache made afterwards too (an open one reads it when it opens again)."""
    url = proxy.start()
    assert ask(url, QUESTION, key="one")[0] == "miss"
    caches = proxy.state.partitions
    opened = caches.get(key_digest("one"), ())
    assert isinstance(opened, Partition)
    assert opened.cache.thresholds.global_value != 0.81
    opened.cache.thresholds.set_local(0.95)
    DeviceState(settings).set_global_threshold(0.81)
    DeviceState(settings).set_pooled_bound(BoundEvidence.of_labels(
        np.linspace(0.3, 0.5, 400), np.zeros(400), np.ones(400)).to_record())
    assert opened.cache.thresholds.global_value == 0.81  # seen while open
    assert opened.cache.threshold == 0.95  # its own tuned tau still wins
    caches.release(opened)
    assert ask(url, QUESTION, key="two")[0] == "miss"
    made = caches.get(key_digest("two"), ())
    assert isinstance(made, Partition)
    assert made.cache.threshold == made.cache.thresholds.global_value == 0.81
    assert made.cache.learned.pooled.labels == 400
    caches.release(made)


def test_an_open_cache_answers_while_another_apps_cache_is_being_opened(
        proxy: Proxy, monkeypatch: pytest.MonkeyPatch) -> None:
    """Opening a cache loads it from disk; requests to caches already open must not wait
    behind it (issue 38: hits never wait behind misses). The slow open is injected: a
    real disk is not slow on demand."""
    caches = proxy.state.partitions
    warm = caches.get(key_digest("warm"), ())
    assert isinstance(warm, Partition)
    caches.release(warm)
    entered, go_on = threading.Event(), threading.Event()
    load = partitions.Partitions._load

    def slow_load(self: partitions.Partitions, *args: object, **kwargs: object) -> Partition:
        entered.set()
        assert go_on.wait(30), "the test never let the slow open finish"
        return load(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(partitions.Partitions, "_load", slow_load)
    opened: list[object] = []
    opener = threading.Thread(target=lambda: opened.append(caches.get(key_digest("new"), ())))
    opener.start()
    try:
        assert entered.wait(30), "the new app's cache never started opening"
        again = caches.get(key_digest("warm"), ())  # would block here under one lock
        assert isinstance(again, Partition)
        assert opener.is_alive()  # the other open is still in progress
        caches.release(again)
    finally:
        go_on.set()
        opener.join(30)
    assert isinstance(opened[0], Partition)
    same = caches.get(key_digest("new"), ())  # opened once, now served from the open ones
    assert same is opened[0]
    caches.release(same)
    caches.release(opened[0])  # type: ignore[arg-type]
