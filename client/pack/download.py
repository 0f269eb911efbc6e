"""Fetching the upstream's newest instruction pack: streamed to a partial file beside the
pack in use, resumed with ``Range`` + ``If-Range`` after a cut, capped in size, verified
(format, sha256, model) and only then renamed over the old pack. Whatever goes wrong, the
pack in use stays as it was."""

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import httpx
from meancache.client.errors import PackDownloadError
from meancache.client.http_errors import describe, error_message
from meancache.shared.errors import PackError
from meancache.shared.files import fsync_path
from meancache.shared.pack import PackManifest, read_manifest, read_pack
from meancache.shared.progress import Progress

log = logging.getLogger(__name__)

DEFAULT_MAX_PACK_BYTES = 256 * 1024 * 1024


@dataclass(frozen=True)
class PackUpdate:
    manifest: PackManifest
    changed: bool  # False: the device already had this pack (the server answered 304)
    resumed_from: int = 0  # bytes kept from an earlier, cut download


def download_pack(base_url: str, target: Path, api_key: str | None = None,
                  max_bytes: int = DEFAULT_MAX_PACK_BYTES, progress: Progress | None = None,
                  timeout: float = 30.0) -> PackUpdate:
    """Make ``target`` the upstream's newest pack, answered by the model it serves."""
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    partial = target.with_name(target.name + ".download")
    etag_file = target.with_name(target.name + ".download.etag")
    target.parent.mkdir(parents=True, exist_ok=True)
    with httpx.Client(base_url=base_url.rstrip("/"), headers=headers,
                      timeout=httpx.Timeout(timeout)) as http:
        model = _served_model(http)
        request_headers = {}
        if target.exists():
            try:
                request_headers["If-None-Match"] = f'"{read_manifest(target).body_sha256}"'
            except PackError:
                pass  # the pack in use is unreadable: fetch the whole new one
        start = partial.stat().st_size if partial.exists() and etag_file.exists() else 0
        if start:
            request_headers |= {"Range": f"bytes={start}-", "If-Range": etag_file.read_text()}
        try:
            with http.stream("GET", "/v1/packs/latest", headers=request_headers) as response:
                if response.status_code == 304:
                    return PackUpdate(read_pack(target, model=model).manifest, changed=False)
                if response.status_code >= 400:
                    response.read()
                    raise PackDownloadError(f"the upstream at {base_url} refused the pack "
                                            f"({response.status_code}): "
                                            f"{error_message(response)}")
                start = start if response.status_code == 206 else 0
                total = start + int(response.headers.get("content-length", 0))
                if total > max_bytes:
                    raise PackDownloadError(
                        f"the upstream's pack is {total} bytes, over the {max_bytes}-byte "
                        "limit; raise it with --max-mb if you want a pack this large")
                etag_file.write_text(response.headers.get("etag", ""))
                _stream_to(response, partial, start, max_bytes, progress)
        except httpx.TransportError as exc:
            raise PackDownloadError(f"the pack download from {base_url} was cut off "
                                    f"({describe(exc)}); run the update again to resume "
                                    "it") from None
    return _swap_in(partial, etag_file, target, model, start)


def _served_model(http: httpx.Client) -> str | None:
    """The model the upstream answers with: a pack of another model's answers is refused."""
    try:
        response = http.get("/v1/models")
    except httpx.TransportError as exc:
        raise PackDownloadError(f"cannot reach the upstream at {http.base_url} "
                                f"({describe(exc)})") from None
    if response.status_code >= 400:
        raise PackDownloadError(f"the upstream at {http.base_url} refused the request "
                                f"({response.status_code}): {error_message(response)}")
    models = response.json().get("data") or [{}]
    return models[0].get("id")


def _stream_to(response: httpx.Response, partial: Path, start: int, max_bytes: int,
               progress: Progress | None) -> None:
    total = start + int(response.headers.get("content-length", 0))
    done = start
    with partial.open("ab" if start else "wb") as fh:
        for chunk in response.iter_bytes():  # as received: a cut keeps what came
            done += len(chunk)
            if done > max_bytes:  # a server that sent no or a wrong Content-Length
                fh.close()
                partial.unlink()
                raise PackDownloadError(f"the pack grew past the {max_bytes}-byte limit "
                                        "while downloading; it was discarded")
            fh.write(chunk)
            if progress is not None:
                progress(done, total)
        fh.flush()
        os.fsync(fh.fileno())


def _swap_in(partial: Path, etag_file: Path, target: Path, model: str | None,
             resumed_from: int) -> PackUpdate:
    """Verify the whole download, then rename it over the pack in use."""
    try:
        manifest = read_pack(partial, model=model).manifest
    except PackError:
        partial.unlink(missing_ok=True)
        etag_file.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    etag_file.unlink(missing_ok=True)
    fsync_path(target.parent)
    log.info("instruction pack %s (%d entries) is in use", manifest.pack_id, manifest.count)
    return PackUpdate(manifest, changed=True, resumed_from=resumed_from)
