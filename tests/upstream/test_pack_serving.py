"""Publishing packs on the real upstream server and downloading them with the device's
client: ETag, Range resume, auth, and every bad download leaving the old pack in use."""

import json
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from meancache.client.errors import PackDownloadError
from meancache.client.pack import PackStore, download_pack
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.errors import PackCorruptError, PackMismatchError
from meancache.shared.pack import read_pack, write_pack
from meancache.upstream.server.app import ServerSettings

from tests.support.servers import running_upstream

MODEL = "builtin:tiny"
KEY = "pack-key"
ENTRIES = [(f"What is the number {n}?", f"It is {n}. " * 20) for n in range(50)]


@pytest.fixture(scope="module")
def packs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("published")


@pytest.fixture(scope="module")
def server(packs_dir: Path) -> Iterator[str]:
    with running_upstream(MODEL, ServerSettings(api_key=KEY, packs_dir=packs_dir)) as url:
        yield url


def upstream(url: str, key: str = KEY) -> UpstreamClient:
    return UpstreamClient(url, key, connect_retries=0)


def publish(packs_dir: Path, name: str, entries: list[tuple[str, str]] = ENTRIES,
            model: str = MODEL) -> Path:
    for old in packs_dir.glob("*"):
        old.unlink()
    path = packs_dir / f"{name}.mcpack"
    write_pack(path, entries, model=model, sigma=8.0)
    return path


def test_latest_pack_with_etag_range_and_auth(server: str, packs_dir: Path) -> None:
    path = publish(packs_dir, "a")
    (packs_dir / "zz-broken.mcpack").write_bytes(b"not a pack\n")  # skipped, not served
    data, sha = path.read_bytes(), read_pack(path).manifest.body_sha256
    auth = {"Authorization": f"Bearer {KEY}"}
    assert httpx.get(f"{server}/v1/packs/latest").status_code == 401
    whole = httpx.get(f"{server}/v1/packs/latest", headers=auth)
    assert (whole.status_code, whole.content, whole.headers["etag"]) == (200, data, f'"{sha}"')
    part = httpx.get(f"{server}/v1/packs/latest",
                     headers=auth | {"Range": "bytes=100-", "If-Range": f'"{sha}"'})
    assert (part.status_code, part.content) == (206, data[100:])
    stale = httpx.get(f"{server}/v1/packs/latest",
                      headers=auth | {"Range": "bytes=100-", "If-Range": '"other"'})
    assert (stale.status_code, stale.content) == (200, data)  # a resume across packs restarts
    same = httpx.get(f"{server}/v1/packs/latest", headers=auth | {"If-None-Match": f'"{sha}"'})
    assert same.status_code == 304
    manifest = httpx.get(f"{server}/v1/packs/latest/manifest", headers=auth).json()
    assert (manifest["count"], manifest["model"], manifest["body_sha256"]) == (50, MODEL, sha)


def test_a_server_without_packs_answers_404() -> None:
    with running_upstream(MODEL) as url:
        response = httpx.get(f"{url}/v1/packs/latest")
    assert response.status_code == 404
    assert response.json()["error"]["code"] == "pack_not_found"


def test_download_installs_then_304_then_resumes(server: str, packs_dir: Path,
                                                 tmp_path: Path) -> None:
    publish(packs_dir, "b")
    target = tmp_path / "packs" / "current.mcpack"
    seen: list[tuple[int, int]] = []
    first = download_pack(upstream(server), target,
                          progress=lambda d, t: seen.append((d, t)))
    assert first.changed and first.manifest.count == 50
    assert seen[-1][0] == seen[-1][1] == target.stat().st_size
    assert PackStore(target.parent).lookup("what is the number 7").answer.startswith("It is 7.")
    assert not download_pack(upstream(server), target).changed  # 304: already has it

    newer = publish(packs_dir, "c", ENTRIES[:30])
    sha = read_pack(newer).manifest.body_sha256
    partial = target.with_name("current.mcpack.download")
    partial.write_bytes(newer.read_bytes()[:500])  # a download cut after 500 bytes
    target.with_name("current.mcpack.download.etag").write_text(f'"{sha}"')
    resumed = download_pack(upstream(server), target)
    assert (resumed.changed, resumed.resumed_from, resumed.manifest.count) == (True, 500, 30)
    assert target.read_bytes() == newer.read_bytes() and not partial.exists()


def test_bad_downloads_leave_the_old_pack_in_use(server: str, packs_dir: Path,
                                                 tmp_path: Path) -> None:
    target = tmp_path / "current.mcpack"
    write_pack(target, ENTRIES[:3], model=MODEL, sigma=1.0)
    old = target.read_bytes()

    publish(packs_dir, "d", model="another-model")
    with pytest.raises(PackMismatchError, match="another-model"):
        download_pack(upstream(server), target)
    published = publish(packs_dir, "e")
    with pytest.raises(PackDownloadError, match="over the 1000-byte limit"):
        download_pack(upstream(server), target, max_bytes=1000)
    published.write_bytes(published.read_bytes().replace(b"It is 4.", b"It is 5."))
    with pytest.raises(PackCorruptError, match="sha256"):
        download_pack(upstream(server), target)
    with pytest.raises(PackDownloadError, match="401"):
        download_pack(upstream(server, "wrong-key"), target)
    assert target.read_bytes() == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current.mcpack"]


def cut_off_server(body: bytes, declared: int) -> tuple[str, socket.socket]:
    """A fault no real server produces on demand: the connection drops mid-body."""
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        for _ in range(3):  # the model list, the manifest (none here), the pack
            conn, _ = listener.accept()
            with conn:
                request = conn.recv(65536)
                if b"/manifest" in request:
                    conn.sendall(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n")
                elif b"/v1/models" in request:
                    payload = json.dumps({"data": [{"id": MODEL}]}).encode()
                    conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (len(payload), payload))
                else:
                    conn.sendall(b"HTTP/1.1 200 OK\r\netag: \"x\"\r\n"
                                 b"content-length: %d\r\n\r\n%s" % (declared, body))

    threading.Thread(target=serve, daemon=True).start()
    return f"http://127.0.0.1:{listener.getsockname()[1]}", listener


def test_a_cut_download_keeps_the_old_pack_and_can_resume(tmp_path: Path) -> None:
    target = tmp_path / "current.mcpack"
    write_pack(target, ENTRIES[:3], model=MODEL, sigma=1.0)
    old = target.read_bytes()
    source = tmp_path / "new.mcpack"
    write_pack(source, ENTRIES, model=MODEL, sigma=1.0)
    url, listener = cut_off_server(source.read_bytes()[:700], source.stat().st_size)
    with listener, pytest.raises(PackDownloadError, match="cut off.*resume"):
        download_pack(UpstreamClient(url, connect_retries=0), target)
    assert target.read_bytes() == old
    assert target.with_name("current.mcpack.download").read_bytes() == \
        source.read_bytes()[:700]  # kept for the next update to resume from


def test_pack_update_and_stats_commands(server: str, packs_dir: Path, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    from meancache.cli import main

    publish(packs_dir, "f")
    base = ["--config-dir", str(tmp_path), "--data-dir", str(tmp_path / "data"), "pack"]
    assert main([*base, "update", "--upstream", server, "--api-key", "wrong"]) == 2
    assert "missing or wrong API key" in capsys.readouterr().err
    assert main([*base, "update", "--upstream", server, "--api-key", KEY]) == 0
    assert "50 instructions answered by builtin:tiny" in capsys.readouterr().out
    publish(packs_dir, "g", ENTRIES[:40])  # a base URL ending in /v1 names the same server
    assert main([*base, "update", "--upstream", f"{server}/v1/", "--api-key", KEY]) == 0
    assert "40 instructions answered by builtin:tiny" in capsys.readouterr().out
    assert main([*base, "stats", "--json"]) == 0
    stats = json.loads(capsys.readouterr().out)
    assert (stats["entries"], stats["model"], stats["hits"]) == (40, MODEL, 0)
    assert stats["size_bytes"] == (packs_dir / "g.mcpack").stat().st_size


def test_the_start_line_names_the_pack_it_serves(tmp_path: Path) -> None:
    from meancache.upstream.server.serve import describe_packs

    packs = tmp_path / "packs"
    packs.mkdir()
    assert describe_packs(ServerSettings()) == ""  # publishes none: says nothing of packs
    assert describe_packs(ServerSettings(packs_dir=packs)) == (
        f", and no instruction pack yet (none in {packs})")
    manifest = write_pack(packs / "pack-1.mcpack", [("What is Python?", "A language.")],
                          model="builtin:tiny", sigma=4.0)
    assert describe_packs(ServerSettings(packs_dir=packs)) == (
        f", and instruction pack {manifest.pack_id} (1 instructions, pack-1.mcpack)")


def built_at(path: Path, created: str) -> None:
    """The pack at ``path`` as if built at ``created`` (the manifest line only: the body
    and its sha256 stay)."""
    head, body = path.read_bytes().split(b"\n", 1)
    manifest = json.loads(head) | {"created": created}
    path.write_bytes(json.dumps(manifest).encode() + b"\n" + body)


def test_a_pack_older_than_the_one_in_use_is_refused_unless_downgrade_is_allowed(
        server: str, packs_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 38: a pack built before the one in use (same model) is a rollback."""
    from meancache.cli import main

    base = ["--config-dir", str(tmp_path), "--data-dir", str(tmp_path / "data"), "pack",
            "update", "--upstream", server, "--api-key", KEY]
    built_at(publish(packs_dir, "new", ENTRIES[:20]), "2026-06-01T12:00:00+00:00")
    assert main(base) == 0
    target = tmp_path / "data" / "packs" / "current.mcpack"
    in_use = target.read_bytes()
    built_at(publish(packs_dir, "old", ENTRIES[:10]), "2026-05-01T12:00:00+00:00")
    capsys.readouterr()
    assert main(base) == 2
    err = capsys.readouterr().err
    assert err.strip().count("\n") == 0 and "Traceback" not in err, err
    assert "refused the upstream's pack" in err and "built '2026-05-01T12:00:00+00:00'" in err
    assert "--allow-downgrade" in err
    assert target.read_bytes() == in_use
    assert sorted(p.name for p in target.parent.iterdir()) == ["current.mcpack"]
    assert main([*base, "--allow-downgrade"]) == 0
    assert "10 instructions" in capsys.readouterr().out
    assert read_pack(target).manifest.count == 10


def test_a_downgrade_is_caught_in_the_download_when_no_manifest_is_announced(
        tmp_path: Path) -> None:
    """An upstream without the manifest endpoint: the whole pack is checked before it
    replaces the one in use."""
    target = tmp_path / "current.mcpack"
    write_pack(target, ENTRIES[:3], model=MODEL, sigma=1.0)
    built_at(target, "2026-06-01T12:00:00+00:00")
    in_use = target.read_bytes()
    source = tmp_path / "old.mcpack"
    write_pack(source, ENTRIES, model=MODEL, sigma=1.0)
    built_at(source, "2026-05-01T00:00:00+00:00")
    url, listener = cut_off_server(source.read_bytes(), source.stat().st_size)
    with listener, pytest.raises(PackDownloadError, match="refused the upstream's pack"):
        download_pack(UpstreamClient(url, connect_retries=0), target)
    assert target.read_bytes() == in_use
    assert sorted(p.name for p in tmp_path.iterdir()) == ["current.mcpack", "old.mcpack"]
