"""Pack hosting: the newest instruction pack in the packs directory, whole or by byte
range (a device resumes a cut download with ``Range`` + ``If-Range``), and its manifest.

The ETag is the pack's body sha256, so it names the content: a device that already has
the pack gets 304 for ``If-None-Match``, and a resume across a republished pack gets the
whole new file instead of a mixed one.
"""

import logging
from pathlib import Path

from meancache.shared.errors import PackError
from meancache.shared.pack import PackManifest, read_manifest
from meancache.upstream.errors import NoPackError
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route

log = logging.getLogger(__name__)

PACK_SUFFIX = ".mcpack"
PACK_MEDIA_TYPE = "application/x-meancache-pack"


def latest_pack(packs_dir: Path | None) -> tuple[Path, PackManifest]:
    """The newest readable pack (by its manifest's ``created``, then name); unreadable
    files are skipped, with a log line, so one bad upload does not hide the others."""
    if packs_dir is None:
        raise NoPackError("this server publishes no instruction packs (start it with "
                          "--packs-dir DIR)")
    found: list[tuple[str, str, Path, PackManifest]] = []
    for path in packs_dir.glob(f"*{PACK_SUFFIX}"):
        try:
            manifest = read_manifest(path)
        except PackError as exc:
            log.warning("skipping pack %s: %s", path, exc)
            continue
        found.append((manifest.created, path.name, path, manifest))
    if not found:
        raise NoPackError(f"no instruction pack is published yet (none in {packs_dir}); "
                          "build one with `meancache pack build`")
    _, _, path, manifest = max(found)
    return path, manifest


def pack_routes(packs_dir: Path | None, auth: list[Middleware]) -> list[Route]:
    """The routes to add to the API, behind the same auth as the rest of it."""

    async def latest(request: Request) -> Response:
        path, manifest = latest_pack(packs_dir)
        etag = f'"{manifest.body_sha256}"'
        if etag in request.headers.get("if-none-match", ""):
            return Response(status_code=304, headers={"etag": etag})
        return FileResponse(path, media_type=PACK_MEDIA_TYPE, headers={"etag": etag},
                            filename=f"{manifest.pack_id}{PACK_SUFFIX}")

    async def manifest_route(request: Request) -> Response:
        _, manifest = latest_pack(packs_dir)
        return JSONResponse(manifest.to_json() | {"pack_id": manifest.pack_id},
                            headers={"etag": f'"{manifest.body_sha256}"'})

    return [
        Route("/v1/packs/latest", latest, methods=["GET"], name="packs", middleware=auth),
        Route("/v1/packs/latest/manifest", manifest_route, methods=["GET"], name="packs",
              middleware=auth),
    ]
