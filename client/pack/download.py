"""Fetching the upstream's newest instruction pack: streamed to a partial file beside the
pack in use, resumed with ``Range`` + ``If-Range`` after a cut, capped in size, verified
(format, sha256, model) and only then renamed over the old pack. Whatever goes wrong, the
pack in use stays as it was.

A pack built before the one in use for the same model (its manifest's ``created``) is
refused unless the user allows a downgrade (``allow_downgrade``, `--allow-downgrade`): the
rollback rule of signed global models (shared.fl.freshness). Packs carry no signature (they
are trusted as the upstream that serves them is, through its TLS and API key), so this
keeps a stale or restored upstream from taking a device back, not a hostile one."""

import datetime as dt
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.client.errors import (
    PackDownloadError,
    UpstreamRejectedError,
    UpstreamRequestError,
    UpstreamUnavailableError,
)
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.errors import PackError
from meancache.shared.files import fsync_path
from meancache.shared.pack import PackManifest, manifest_from_json, read_manifest, read_pack
from meancache.shared.pack.format import MAX_MANIFEST_BYTES, check_compatible
from meancache.shared.progress import Progress

if TYPE_CHECKING:
    import httpx

log = logging.getLogger(__name__)

DEFAULT_MAX_PACK_BYTES = 256 * 1024 * 1024
LATEST = "/v1/packs/latest"
MANIFEST = "/v1/packs/latest/manifest"
# However slowly an upstream sends, a download ends by then (256 MB at 0.5 MB/s fits).
PACK_DEADLINE_SECONDS = 600.0


@dataclass(frozen=True)
class PackUpdate:
    manifest: PackManifest
    changed: bool  # False: the device already had this pack (the server answered 304)
    resumed_from: int = 0  # bytes kept from an earlier, cut download


def download_pack(upstream: UpstreamClient, target: Path,
                  max_bytes: int = DEFAULT_MAX_PACK_BYTES,
                  progress: Progress | None = None,
                  allow_downgrade: bool = False) -> PackUpdate:
    """Make ``target`` the upstream's newest pack, answered by the model it serves (and
    built no earlier than the pack in use, unless ``allow_downgrade``).

    Blocking: run it in a worker thread from the app."""
    partial = target.with_name(target.name + ".download")
    etag_file = target.with_name(target.name + ".download.etag")
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        served = upstream.served_models()
    except UpstreamRequestError as exc:
        raise _failed(upstream, exc, "the request") from None
    model = served[0] if served else None  # a pack of another model's answers is refused
    in_use = None
    if target.exists():
        try:
            in_use = read_manifest(target)
        except PackError:
            pass  # the pack in use is unreadable: fetch the whole new one
    floor = None if allow_downgrade else in_use
    try:
        _check_announced(upstream, model, max_bytes, floor)
    except UpstreamRequestError as exc:
        raise _failed(upstream, exc, "the pack's manifest") from None
    headers: dict[str, str] = {}
    if in_use is not None:
        headers["If-None-Match"] = f'"{in_use.body_sha256}"'
    start = partial.stat().st_size if partial.exists() and etag_file.exists() else 0
    if start:
        headers |= {"Range": f"bytes={start}-", "If-Range": etag_file.read_text()}
    try:
        with upstream.stream(LATEST, headers) as response:
            if response.status_code == 304:
                return PackUpdate(read_pack(target, model=model).manifest, changed=False)
            start = start if response.status_code == 206 else 0
            total = start + _length(response)
            if total > max_bytes:
                raise PackDownloadError(
                    f"the upstream's pack is {total} bytes, over the {max_bytes}-byte "
                    "limit; raise it with --max-mb if you want a pack this large")
            etag_file.write_text(response.headers.get("etag", "")[:200])
            _stream_to(response, partial, start, max_bytes, progress)
    except PackDownloadError:
        partial.unlink(missing_ok=True)
        etag_file.unlink(missing_ok=True)
        raise
    except UpstreamUnavailableError as exc:
        if exc.status is not None:  # a 429 or 5xx: nothing was sent
            raise _failed(upstream, exc, "the pack") from None
        raise PackDownloadError(f"the pack download was cut off: {exc}; run the update "
                                "again to resume it") from None
    except UpstreamRejectedError as exc:
        raise _failed(upstream, exc, "the pack") from None
    return _swap_in(partial, etag_file, target, model, start, floor)


def _check_announced(upstream: UpstreamClient, model: str | None, max_bytes: int,
                     floor: PackManifest | None) -> None:
    """Refuse, before any of its body comes down, a pack whose manifest (the upstream's
    manifest endpoint; one without it is checked once downloaded) names another model, a
    body over the limit, or a build older than ``floor`` (the pack in use)."""
    data = upstream.small_json(MANIFEST, MAX_MANIFEST_BYTES)
    if data is None:
        return
    where = f"the upstream's pack ({upstream.base_url})"
    manifest = manifest_from_json(data, where)
    check_compatible(Path(where), manifest, model, None)
    _check_not_older(manifest, floor)
    if manifest.body_bytes > max_bytes:
        raise PackDownloadError(
            f"the upstream's pack is {manifest.body_bytes} bytes, over the {max_bytes}-byte "
            "limit; raise it with --max-mb if you want a pack this large")


def _built(manifest: PackManifest) -> dt.datetime | None:
    try:
        when = dt.datetime.fromisoformat(manifest.created)
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=dt.UTC)


def _check_not_older(manifest: PackManifest, in_use: PackManifest | None) -> None:
    """PackDownloadError for a pack of the same model built before the one in use (or
    with no readable build time, which cannot be shown newer)."""
    if in_use is None or in_use.model != manifest.model or (floor := _built(in_use)) is None:
        return
    built = _built(manifest)
    if built is None or built < floor:
        raise PackDownloadError(
            f"refused the upstream's pack {manifest.pack_id} built {manifest.created!r}: the "
            f"pack in use ({in_use.pack_id}) was built later, {in_use.created}, and an older "
            "pack is a rollback; pass --allow-downgrade (allow_downgrade) to install it "
            "anyway")


def _failed(upstream: UpstreamClient, exc: UpstreamRequestError, what: str
            ) -> PackDownloadError:
    if isinstance(exc, UpstreamRejectedError):
        return PackDownloadError(f"the upstream at {upstream.base_url} refused {what} "
                                 f"({exc.status}): {exc}")
    return PackDownloadError(str(exc))  # it names the upstream


def _stream_to(response: "httpx.Response", partial: Path, start: int, max_bytes: int,
               progress: Progress | None) -> None:
    total = start + _length(response)
    done = start
    deadline = time.monotonic() + PACK_DEADLINE_SECONDS
    with partial.open("ab" if start else "wb") as fh:
        for chunk in response.iter_bytes():  # as received: a cut keeps what came
            done += len(chunk)
            if time.monotonic() > deadline:
                raise PackDownloadError(f"the pack download took longer than "
                                        f"{PACK_DEADLINE_SECONDS:.0f} s and was discarded; "
                                        "try again when the upstream is faster")
            if done > max_bytes:  # a server that sent no or a wrong Content-Length
                raise PackDownloadError(f"the pack grew past the {max_bytes}-byte limit "
                                        "while downloading; it was discarded")
            fh.write(chunk)
            if progress is not None:
                progress(done, total)
        fh.flush()
        os.fsync(fh.fileno())


def _length(response: "httpx.Response") -> int:
    declared = response.headers.get("content-length", "")
    return int(declared) if declared.isdigit() and len(declared) < 20 else 0


def _swap_in(partial: Path, etag_file: Path, target: Path, model: str | None,
             resumed_from: int, floor: PackManifest | None) -> PackUpdate:
    """Verify the whole download, then rename it over the pack in use."""
    try:
        manifest = read_pack(partial, model=model).manifest
        _check_not_older(manifest, floor)
    except PackError:
        partial.unlink(missing_ok=True)
        etag_file.unlink(missing_ok=True)
        raise
    os.replace(partial, target)
    etag_file.unlink(missing_ok=True)
    fsync_path(target.parent)
    log.info("instruction pack %s (%d entries) is in use", manifest.pack_id, manifest.count)
    return PackUpdate(manifest, changed=True, resumed_from=resumed_from)
