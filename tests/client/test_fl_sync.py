"""The global-model endpoint and a device syncing from it: a real uvicorn server on
loopback, real checkpoints on disk, real httpx. Faults are injected on the server's side
(damaged weights, a server that is down, one with no model, one that answers nonsense)."""

import json
import shutil
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import closing
from functools import partial
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch
from meancache.client.cache.store import EntryStore
from meancache.client.cache.threshold import ThresholdState
from meancache.client.config import Settings, load_settings
from meancache.client.device_caches import proxy_dir
from meancache.client.errors import SyncError
from meancache.client.fl.sync import SyncResult, sync_global_model
from meancache.client.learning.state import Learned, pooled
from meancache.fl_server.model_endpoint import NO_SIGNED_MODEL, create_model_app
from meancache.shared.errors import CheckpointError
from meancache.shared.files import sha256_file
from meancache.shared.fl.bound_evidence import MAX_WEIGHT, BoundEvidence, cosine_judge
from meancache.shared.fl.checkpoint import (
    LATEST,
    META,
    WEIGHTS,
    GlobalModel,
    load_checkpoint,
    round_dir,
    save_checkpoint,
)
from meancache.shared.fl.signing import (
    LIFETIME_SECONDS,
    PUBLIC_KEY,
    read_public_key,
    server_key,
    sign,
    unsigned_fields,
    verify,
)
from meancache.shared.processes import free_port
from safetensors.torch import save_file
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from tests.support.fl import cache_threshold, impostor_endpoint, publish
from tests.support.servers import serving


# a server on loopback --------------------------------------------------------------------
class CountingApp:
    """Passes requests through and counts them per path, to tell whether a sync downloaded."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.paths: Counter[str] = Counter()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            self.paths[scope["path"]] += 1
        await self.app(scope, receive, send)

    def weights_requests(self) -> int:
        return sum(n for path, n in self.paths.items() if path.endswith("/weights"))


# fixtures --------------------------------------------------------------------------------
@pytest.fixture
def server_root(tmp_path: Path) -> Path:
    return tmp_path / "server" / "checkpoints"


@pytest.fixture
def counted(server_root: Path) -> CountingApp:
    return CountingApp(create_model_app(server_root))


@pytest.fixture
def url(counted: CountingApp) -> Iterator[str]:
    with serving(counted) as base:
        yield base


@pytest.fixture
def settings(tmp_path: Path, server_root: Path) -> Settings:
    """A fresh device (nothing under its data dir yet) that trusts the key the FL server
    made beside its checkpoints."""
    server_key(server_root)
    return load_settings(config_dir=tmp_path / "cfg", data_dir=tmp_path / "data", environ={},
                         encoder_model="minilm",
                         fl_server_public_key=str(server_root / PUBLIC_KEY))






def latest_name_of(root: Path) -> str:
    return (root / LATEST).read_text().strip()


def latest_name(settings: Settings) -> str:
    return (settings.global_model_dir / LATEST).read_text().strip()


def leftovers(settings: Settings) -> list[str]:
    return [p.name for p in settings.global_model_dir.iterdir() if p.name.startswith(".")]


# the endpoint ----------------------------------------------------------------------------
def test_meta_is_404_before_any_round(url: str) -> None:
    for path in ("/v1/global-model", "/v1/global-model/weights",
                 "/v1/global-model/rounds/1/weights"):
        response = httpx.get(url + path)
        assert response.status_code == 404, path
        assert response.json()["error"]["message"]
    assert httpx.get(url + "/health").json() == {"status": "ok"}


def test_meta_describes_the_newest_round_signed_afresh(url: str, server_root: Path) -> None:
    publish(server_root, 1, 0.8)
    newest = publish(server_root, 2, 0.75)
    before = time.time()
    body = httpx.get(url + "/v1/global-model").json()
    after = time.time()
    assert body.pop("weights_url") == "/v1/global-model/rounds/2/weights"
    assert set(body) == {"round", "threshold", "sha256", "base_model", "top_layers",
                         "metrics", "created", "signature", "signed_at", "expires"}
    served = GlobalModel(**body)
    assert unsigned_fields(served) == unsigned_fields(newest)
    assert before <= served.signed_at <= after  # signed at the request, not at publishing
    assert served.expires == pytest.approx(served.signed_at + LIFETIME_SECONDS)
    verify(served, read_public_key(str(server_root / PUBLIC_KEY)))


def test_weights_are_the_newest_file(url: str, server_root: Path) -> None:
    publish(server_root, 1, 0.8)
    newest = publish(server_root, 2, 0.75)
    response = httpx.get(url + "/v1/global-model/weights")
    assert response.status_code == 200
    assert response.content == (round_dir(server_root, 2) / WEIGHTS).read_bytes()
    assert response.headers["X-Meancache-Sha256"] == newest.sha256
    assert response.headers["X-Meancache-Round"] == "2"
    assert int(response.headers["Content-Length"]) == len(response.content)


def test_round_specific_weights(url: str, server_root: Path) -> None:
    first = publish(server_root, 1, 0.8)
    publish(server_root, 2, 0.75)
    response = httpx.get(url + "/v1/global-model/rounds/1/weights")
    assert response.status_code == 200
    assert response.content == (round_dir(server_root, 1) / WEIGHTS).read_bytes()
    assert response.headers["X-Meancache-Sha256"] == first.sha256
    assert response.headers["X-Meancache-Round"] == "1"
    assert httpx.get(url + "/v1/global-model/rounds/7/weights").status_code == 404
    (round_dir(server_root, 1) / WEIGHTS).unlink()  # a round the server removed
    assert httpx.get(url + "/v1/global-model/rounds/1/weights").status_code == 404


def test_only_checkpoints_the_servers_key_verifies_are_served(url: str, server_root: Path,
                                                                tmp_path: Path) -> None:
    """Issue 38, finding 4: a round-0003 with "signature": "" was served."""
    publish(server_root, 1, 0.8)
    second = publish(server_root, 2, 0.75)
    save_checkpoint(server_root, 3, {"w": torch.zeros(2)}, 0.1, base_model="base",
                    top_layers=0)  # unsigned: "signature": ""
    assert json.loads((round_dir(server_root, 3) / META).read_text())["signature"] == ""
    assert latest_name_of(server_root) == "round-0003"
    body = httpx.get(url + "/v1/global-model").json()
    assert (body["round"], body["sha256"]) == (2, second.sha256)  # the newest that verifies
    assert httpx.get(url + "/v1/global-model/weights").content == \
        (round_dir(server_root, 2) / WEIGHTS).read_bytes()
    refused = httpx.get(url + "/v1/global-model/rounds/3/weights")
    assert refused.status_code == 404
    assert "round 3 is not signed with the FL server's key" in \
        refused.json()["error"]["message"]
    # signed by another key, or a signed round copied under another round's name
    save_checkpoint(server_root, 4, {"w": torch.zeros(2)}, 0.1, base_model="base",
                    top_layers=0, sign=partial(sign, key=server_key(tmp_path / "other")))
    shutil.copytree(round_dir(server_root, 1), round_dir(server_root, 5))
    (server_root / LATEST).write_text("round-0005")
    assert httpx.get(url + "/v1/global-model").json()["round"] == 2
    for number in (4, 5):
        assert httpx.get(f"{url}/v1/global-model/rounds/{number}/weights").status_code == 404


def test_with_no_signed_checkpoint_the_endpoint_says_so(url: str, server_root: Path) -> None:
    save_checkpoint(server_root, 1, {"w": torch.zeros(2)}, 0.8, base_model="base",
                    top_layers=0)
    for path in ("/v1/global-model", "/v1/global-model/weights"):
        reply = httpx.get(url + path)
        assert reply.status_code == 404
        assert reply.json()["error"]["message"] == NO_SIGNED_MODEL


# syncing a device ------------------------------------------------------------------------
def test_sync_installs_the_global_model(url: str, server_root: Path,
                                        settings: Settings) -> None:
    published = publish(server_root, 3, 0.77)
    calls: list[tuple[int, int]] = []
    result = sync_global_model(url, settings, progress=lambda done, total:
                               calls.append((done, total)))
    assert result == SyncResult(3, 0.77, published.sha256, True,
                                round_dir(settings.global_model_dir, 3))
    assert latest_name(settings) == "round-0003"
    meta, state = load_checkpoint(result.path)  # verifies the sha256
    assert unsigned_fields(meta) == unsigned_fields(published)
    assert set(state) == {"w", "b"}
    assert cache_threshold(settings) == pytest.approx(0.77)
    size = (round_dir(server_root, 3) / WEIGHTS).stat().st_size
    assert calls and calls[-1] == (size, size)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert leftovers(settings) == []


def test_sync_sets_the_tau_of_every_proxy_cache_even_an_open_one(
        url: str, server_root: Path, settings: Settings) -> None:
    opened = EntryStore(proxy_dir(settings) / "key-one" / "0000000000000000" / "cache")
    try:
        publish(server_root, 3, 0.77)
        sync_global_model(url, settings)
        assert ThresholdState(opened).global_value == pytest.approx(0.77)
    finally:
        opened.close()
    assert cache_threshold(settings) == pytest.approx(0.77)


def test_second_sync_downloads_nothing(url: str, server_root: Path, settings: Settings,
                                       counted: CountingApp) -> None:
    publish(server_root, 1, 0.8)
    first = sync_global_model(url, settings)
    weights = first.path / WEIGHTS
    mtime = weights.stat().st_mtime_ns
    assert counted.weights_requests() == 1
    again = sync_global_model(url, settings, progress=lambda *_: pytest.fail("downloaded"))
    assert again.changed is False
    assert (again.round, again.sha256, again.path) == (first.round, first.sha256, first.path)
    assert counted.weights_requests() == 1
    assert weights.stat().st_mtime_ns == mtime


def test_newer_round_replaces_the_installed_one(url: str, server_root: Path,
                                                settings: Settings) -> None:
    publish(server_root, 1, 0.8)
    sync_global_model(url, settings)
    newer = publish(server_root, 2, 0.7)
    result = sync_global_model(url, settings)
    assert (result.round, result.changed, result.sha256) == (2, True, newer.sha256)
    assert latest_name(settings) == "round-0002"
    assert unsigned_fields(load_checkpoint(result.path)[0]) == unsigned_fields(newer)
    assert cache_threshold(settings) == pytest.approx(0.7)


def test_same_weights_new_threshold_is_relabelled_without_download(
        url: str, server_root: Path, settings: Settings, counted: CountingApp) -> None:
    first = publish(server_root, 1, 0.8, seed=5)
    sync_global_model(url, settings)
    second = publish(server_root, 2, 0.72, seed=5)  # same weights, so the same sha256
    assert second.sha256 == first.sha256
    result = sync_global_model(url, settings)
    assert (result.round, result.changed) == (2, True)
    assert counted.weights_requests() == 1
    assert latest_name(settings) == "round-0002"
    assert unsigned_fields(load_checkpoint(result.path)[0]) == unsigned_fields(second)
    assert cache_threshold(settings) == pytest.approx(0.72)


def test_corrupted_download_keeps_the_installed_model(url: str, server_root: Path,
                                                      settings: Settings) -> None:
    kept = publish(server_root, 1, 0.8)
    sync_global_model(url, settings)
    damaged = publish(server_root, 2, 0.6)
    weights = round_dir(server_root, 2) / WEIGHTS
    weights.write_bytes(weights.read_bytes()[:-8] + b"tampered")  # no longer its sha256
    with pytest.raises(CheckpointError) as info:
        sync_global_model(url, settings)
    assert damaged.sha256 in str(info.value)
    assert sha256_file(weights) in str(info.value)
    assert latest_name(settings) == "round-0001"
    assert unsigned_fields(load_checkpoint(round_dir(settings.global_model_dir, 1))[0]) == \
        unsigned_fields(kept)
    assert not round_dir(settings.global_model_dir, 2).exists()
    assert leftovers(settings) == []
    assert cache_threshold(settings) == pytest.approx(0.8)


def test_server_down(settings: Settings) -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    with pytest.raises(SyncError, match="cannot reach the FL server") as info:
        sync_global_model(url, settings, timeout=2)
    assert url in str(info.value)
    assert not settings.global_model_dir.exists()


def test_no_model_yet(url: str, settings: Settings) -> None:
    with pytest.raises(SyncError, match="no global model yet"):
        sync_global_model(url, settings)
    assert not (settings.global_model_dir / LATEST).exists()


def test_invalid_description(settings: Settings) -> None:
    async def meta(request: Request) -> Response:
        return JSONResponse({"round": "three", "threshold": 0.8, "sha256": "0" * 64})

    async def broken(request: Request) -> Response:
        return JSONResponse({"error": {"message": "disk on fire"}}, status_code=500)

    app = Starlette(routes=[Route("/v1/global-model", meta),
                            Route("/bad/v1/global-model", broken)])
    with serving(app) as base:
        with pytest.raises(SyncError, match="invalid global-model description"):
            sync_global_model(base, settings)
        with pytest.raises(SyncError, match="answered 500.*disk on fire"):
            sync_global_model(base + "/bad", settings)


@pytest.mark.parametrize("threshold", [1.0, 0.0, "0.8", True])
def test_announced_threshold_outside_0_1_is_refused(settings: Settings, threshold: object
                                                     ) -> None:
    async def meta(request: Request) -> Response:
        return JSONResponse({"round": 3, "threshold": threshold, "sha256": "0" * 64,
                             "base_model": "base", "top_layers": 0})

    with serving(Starlette(routes=[Route("/v1/global-model", meta)])) as base:
        with pytest.raises(SyncError, match="invalid global-model description .a similarity "
                                            "threshold must lie strictly between 0 and 1"):
            sync_global_model(base, settings)
    assert not settings.cache_dir.exists()  # the cache's tau was not touched


# downloads stay small, on the configured server, finite, and few ---------------------------
def test_a_redirect_to_another_host_is_refused(settings: Settings, server_root: Path) -> None:
    publish(server_root, 1, 0.8)
    elsewhere = CountingApp(create_model_app(server_root))
    with serving(elsewhere) as other:
        async def redirect(request: Request) -> Response:
            return Response(status_code=302, headers={"Location": other + request.url.path})

        app = Starlette(routes=[Route("/v1/global-model", redirect),
                                Route("/v1/global-model/{rest:path}", redirect)])
        with serving(app) as base:
            with pytest.raises(SyncError, match="redirected /v1/global-model to .*downloads "
                                                "only from the server it is configured with"):
                sync_global_model(base, settings)
    assert not elsewhere.paths  # the other host was never asked
    assert not (settings.global_model_dir / LATEST).exists()


def test_weights_url_on_another_host_is_refused(settings: Settings) -> None:
    async def meta(request: Request) -> Response:
        return JSONResponse({"round": 3, "threshold": 0.8, "sha256": "0" * 64,
                             "base_model": "base", "top_layers": 0,
                             "weights_url": "http://203.0.113.9/weights"})

    with serving(Starlette(routes=[Route("/v1/global-model", meta)])) as base:
        with pytest.raises(SyncError, match="'http://203.0.113.9/weights' is not a path on "
                                            "this server"):
            sync_global_model(base, settings)


def test_oversized_downloads_are_cut_off(url: str, server_root: Path, settings: Settings
                                         ) -> None:
    publish(server_root, 1, 0.8)
    size = (round_dir(server_root, 1) / WEIGHTS).stat().st_size
    with pytest.raises(SyncError, match=f"larger than {size - 1} bytes"):
        sync_global_model(url, settings, max_weights_bytes=size - 1)
    assert leftovers(settings) == [] and not (settings.global_model_dir / LATEST).exists()

    async def huge(request: Request) -> Response:
        return Response(b"{" * (1 << 17), media_type="application/json")

    with serving(Starlette(routes=[Route("/v1/global-model", huge)])) as base:
        with pytest.raises(SyncError, match="description of more than 65536 bytes"):
            sync_global_model(base, settings)


def test_non_finite_weights_are_refused(url: str, server_root: Path, settings: Settings
                                        ) -> None:
    save_checkpoint(server_root, 1, {"w": torch.tensor([1.0, float("nan")])}, 0.8,
                    base_model="base", top_layers=0,
                    sign=partial(sign, key=server_key(server_root)))
    with pytest.raises(CheckpointError, match=r"not usable \(the weights hold non-finite"):
        sync_global_model(url, settings)
    assert not (settings.global_model_dir / LATEST).exists() and leftovers(settings) == []


def test_only_the_newest_rounds_are_kept(url: str, server_root: Path, settings: Settings
                                         ) -> None:
    for number in range(1, 6):
        publish(server_root, number, 0.8)
        sync_global_model(url, settings)
    kept = sorted(p.name for p in settings.global_model_dir.glob("round-*"))
    assert kept == ["round-0003", "round-0004", "round-0005"]
    assert latest_name(settings) == "round-0005"


# the server's signature ------------------------------------------------------------------
def test_a_signed_global_model_is_installed(url: str, server_root: Path, settings: Settings
                                            ) -> None:
    device = settings
    published = publish(server_root, 1, 0.8)
    assert published.signature
    result = sync_global_model(url, device)
    assert result.changed
    assert unsigned_fields(load_checkpoint(result.path)[0]) == unsigned_fields(published)


def test_a_tampered_checkpoint_is_neither_served_nor_installed(
        url: str, server_root: Path, settings: Settings) -> None:
    device = settings
    kept = publish(server_root, 1, 0.8)
    sync_global_model(url, device)
    publish(server_root, 2, 0.8)
    # Whoever can write the served files swaps in weights of theirs and fixes the hash.
    directory = round_dir(server_root, 2)
    save_file({"w": torch.full((4, 4), 9.0)}, str(directory / WEIGHTS))
    meta = json.loads((directory / META).read_text())
    meta |= {"sha256": sha256_file(directory / WEIGHTS), "threshold": 0.01}
    (directory / META).write_text(json.dumps(meta))
    # The endpoint serves the newest round its key verifies, and not round 2's weights:
    assert httpx.get(url + "/v1/global-model").json()["round"] == 1
    assert httpx.get(url + "/v1/global-model/rounds/2/weights").status_code == 404
    assert sync_global_model(url, device).changed is False
    # ... and a device refuses it from whoever serves it in the endpoint's place.
    with serving(impostor_endpoint(server_root)) as impostor:
        with pytest.raises(CheckpointError, match="round 2 is not signed by the FL server's "
                                                  "key"):
            sync_global_model(impostor, device)
    assert latest_name(device) == "round-0001"
    assert unsigned_fields(load_checkpoint(round_dir(device.global_model_dir, 1))[0]) == \
        unsigned_fields(kept)
    assert cache_threshold(device) == pytest.approx(0.8)


def _pooled_labels(settings: Settings, judge: str | None = None) -> int:
    with closing(EntryStore(settings.cache_dir)) as store:
        return pooled(store, judge).labels


def test_sync_installs_the_pooled_bound_evidence_only_as_signed(
        url: str, server_root: Path, settings: Settings) -> None:
    """The error-bound evidence the server pooled travels in the signed description, as
    the threshold does: both pools (the verifier's labels and the cosine's, each naming
    its judge) installed with the model, and a copy whose evidence was altered (more
    right labels, the hash fixed) is refused from whoever serves it, as is a signed one
    whose cosine pool no labels could make; a model published with one pool (before the
    cosine's was pooled) still installs."""
    evidence = BoundEvidence.of_labels(np.linspace(0.3, 0.5, 400), np.zeros(400), np.ones(400))
    cosine = BoundEvidence.of_labels(np.linspace(0.8, 0.9, 90), np.zeros(90), np.ones(90)
                                     ).judged_by(cosine_judge("space"))
    state = {"w": torch.zeros(4, 4)}
    save_checkpoint(server_root, 1, state, 0.8, "base", 0, {},
                    partial(sign, key=server_key(server_root)),
                    bound=evidence.judged_by("verifier").to_record(),
                    cosine_bound=cosine.to_record())
    sync_global_model(url, settings)
    assert _pooled_labels(settings) == 400 and _pooled_labels(settings, "verifier") == 400
    assert _pooled_labels(settings, cosine_judge("space")) == 90
    with closing(EntryStore(settings.cache_dir)) as store:  # a cache applies its judge's
        assert Learned(store, 0.02, 0.5, judge=cosine_judge("space")).bound.pooled == 90
        assert Learned(store, 0.02, 0.556, judge="verifier").bound.pooled == 400
    for number, field, key in ((2, "bound", "bound-labels"),
                               (3, "cosine_bound", "bound-labels")):
        save_checkpoint(server_root, number, state, 0.8, "base", 0, {},
                        partial(sign, key=server_key(server_root)),
                        bound=evidence.to_record(), cosine_bound=cosine.to_record())
        meta = json.loads((round_dir(server_root, number) / META).read_text())
        meta[field][key][0] += 1000
        meta[field]["bound-weight"][0] += 1000
        meta[field]["bound-weight-squared"][0] += 1000
        (round_dir(server_root, number) / META).write_text(json.dumps(meta))
        with serving(impostor_endpoint(server_root)) as impostor:
            with pytest.raises(CheckpointError, match=f"round {number} is not signed"):
                sync_global_model(impostor, settings)
        assert _pooled_labels(settings, cosine_judge("space")) == 90
    oversized = cosine.to_record()  # signed by the server, but more weight than labels
    oversized["bound-weight"][0] = 10 * MAX_WEIGHT * oversized["bound-labels"][0]
    save_checkpoint(server_root, 4, state, 0.8, "base", 0, {},
                    partial(sign, key=server_key(server_root)), cosine_bound=oversized)
    with pytest.raises(SyncError, match="pooled bound evidence is invalid"):
        sync_global_model(url, settings)
    assert _pooled_labels(settings) == 400 and latest_name(settings) == "round-0001"
    save_checkpoint(server_root, 5, state, 0.8, "base", 0, {},  # one pool, as before
                    partial(sign, key=server_key(server_root)),
                    bound=evidence.judged_by("verifier").to_record())
    sync_global_model(url, settings)
    assert _pooled_labels(settings, "verifier") == 400
    assert _pooled_labels(settings, cosine_judge("space")) == 0  # replaced: none now


def test_an_unsigned_or_foreign_checkpoint_is_refused(server_root: Path, settings: Settings,
                                                      tmp_path: Path) -> None:
    device = settings
    save_checkpoint(server_root, 1, {"w": torch.zeros(2)}, 0.8, base_model="base",
                    top_layers=0)  # no signature
    with serving(impostor_endpoint(server_root)) as impostor:
        with pytest.raises(CheckpointError, match="not signed by the FL server's key"):
            sync_global_model(impostor, device)
        other = tmp_path / "other-server"
        save_checkpoint(server_root, 2, {"w": torch.zeros(2)}, 0.8, base_model="base",
                        top_layers=0, sign=partial(sign, key=server_key(other)))
        with pytest.raises(CheckpointError, match="not signed by the FL server's key"):
            sync_global_model(impostor, device)
    assert not (device.global_model_dir / LATEST).exists()


def test_a_round_number_past_any_file_name_is_a_404(server_root: Path) -> None:
    publish(server_root, 1, 0.8)
    with serving(create_model_app(server_root)) as base:
        reply = httpx.get(f"{base}/v1/global-model/rounds/{'9' * 300}/weights", timeout=30)
    assert reply.status_code == 404
    assert "round numbers run from 0 to" in reply.json()["error"]["message"]
