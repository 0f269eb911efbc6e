"""`meancache pack update` against a hostile upstream (issue 26, item 8), a real HTTP server
on loopback answering what no honest upstream would: every case ends in one clear line and
exit status 2, never a traceback, with no partial file left and the pack in use kept."""

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import meancache.client.pack.download as download
import pytest
from meancache.shared.pack import write_pack
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from meancache.cli import main
from tests.support.servers import serving

MODEL = "builtin:tiny"
MODELS = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
REQUESTED: list[str] = []


def pack_bytes(tmp_path: Path, model: str = MODEL, **manifest: object) -> bytes:
    path = tmp_path / "source.pack"
    write_pack(path, [("what is rice", "a grain")], model, 1.0)
    head, body = path.read_bytes().split(b"\n", 1)
    return json.dumps({**json.loads(head), **manifest}).encode() + b"\n" + body


def upstream(models: Callable[[], Response], manifest: Callable[[], Response],
             latest: Callable[[], Response]) -> Starlette:
    def route(path: str, answer: Callable[[], Response]) -> Route:
        async def endpoint(request: Request) -> Response:
            REQUESTED.append(path)
            return answer()
        return Route(path, endpoint)
    return Starlette(routes=[route("/v1/models", models),
                             route("/v1/packs/latest/manifest", manifest),
                             route("/v1/packs/latest", latest)])


def models_ok() -> Response:
    return JSONResponse(MODELS)


def no_manifest() -> Response:
    return JSONResponse({"error": {"message": "no"}}, status_code=404)


def update(url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
           monkeypatch: pytest.MonkeyPatch) -> tuple[int, str]:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    REQUESTED.clear()
    code = main(["--data-dir", str(tmp_path / "data"), "pack", "update", "--upstream", url])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    leftovers = [p.name for p in (tmp_path / "data" / "packs").glob("*.download*")]
    assert leftovers == [], leftovers
    return code, " ".join(err.split())


@pytest.mark.parametrize(("models", "fragment"), [
    (lambda: PlainTextResponse("<html>hello</html>"), "did not answer GET /v1/models"),
    (lambda: JSONResponse({"data": {"id": MODEL}}), "did not answer GET /v1/models"),
    (lambda: JSONResponse({"data": [{"id": {"nested": 1}}]}), "did not answer GET /v1/models"),
    (lambda: JSONResponse({"data": [{"id": "m" * 100_000}]}), "did not answer GET /v1/models"),
    (lambda: PlainTextResponse("[" * 3_000_000), "did not answer GET /v1/models"),
])
def test_an_odd_model_list_is_one_clear_line(
        models: Callable[[], Response], fragment: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    with serving(upstream(models, no_manifest, no_manifest)) as url:
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and fragment in err, err


@pytest.mark.parametrize(("manifest", "fragment"), [
    ({"body_bytes": 2**62}, "out of range"),
    ({"body_bytes": 2**30}, "over the 268435456-byte limit"),
    ({"body_bytes": -5}, "wrong type"),
    ({"body_bytes": True}, "wrong type"),
    ({"model": "another-model"}, "holds answers of model 'another-model'"),
])
def test_the_manifest_is_checked_before_the_body_comes_down(
        manifest: dict[str, object], fragment: str, tmp_path: Path,
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    body = pack_bytes(tmp_path)
    head = {**json.loads(body.split(b"\n", 1)[0]), **manifest}
    with serving(upstream(models_ok, lambda: JSONResponse(head),
                          lambda: Response(body))) as url:
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and fragment in err, err
    assert "/v1/packs/latest" not in REQUESTED  # refused on the manifest alone


@pytest.mark.parametrize("manifest", [{"body_bytes": 2**62}, {"body_bytes": -1},
                                      {"count": 2**62}, {"body_sha256": 5}])
def test_a_pack_whose_own_manifest_lies_is_refused_and_removed(
        manifest: dict[str, object], tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """An upstream without the manifest endpoint: the pack's first line is checked."""
    body = pack_bytes(tmp_path, **manifest)
    with serving(upstream(models_ok, no_manifest, lambda: Response(body))) as url:
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and "pack" in err, err


def test_a_download_has_an_overall_deadline(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert getattr(download, "PACK_DEADLINE_SECONDS", 0) >= 60  # a slow link has its time
    monkeypatch.setattr(download, "PACK_DEADLINE_SECONDS", 1.5, raising=False)
    body = pack_bytes(tmp_path)

    async def drip() -> AsyncIterator[bytes]:  # each byte well inside any read timeout
        for byte in body:
            yield bytes([byte])
            await asyncio.sleep(0.2)

    with serving(upstream(models_ok, no_manifest, lambda: StreamingResponse(drip()))) as url:
        start = time.monotonic()
        code, err = update(url, tmp_path, capsys, monkeypatch)
    assert code == 2 and "took longer than" in err, err
    assert time.monotonic() - start < 10
