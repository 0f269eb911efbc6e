"""The FL server's newest global model over HTTP, so a new user starts from it.

``GET /v1/global-model`` describes the newest checkpoint (shared.fl.checkpoint layout) and
names a round-specific ``weights_url``: LATEST is read at every request, so a round
installed between the description and the download cannot hand a client the weights of
another round. ``GET /v1/global-model/weights`` serves the newest weights directly.
"""

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from meancache.shared.errors import CheckpointError
from meancache.shared.fl.checkpoint import (
    WEIGHTS,
    GlobalModel,
    latest_checkpoint,
    read_meta,
    round_dir,
)
from meancache.shared.http_limits import GuardRequests
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

log = logging.getLogger(__name__)

CHUNK = 1 << 20
NO_MODEL = "the FL server has no global model yet"


MAX_ROUND = 10**9  # far beyond any federation's rounds, and a short directory name


def weights_path(round_number: int) -> str:
    """The URL path serving exactly one round's weights."""
    return f"/v1/global-model/rounds/{round_number}/weights"


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": {"message": message}}, status_code=status)


def _chunks(fh: BinaryIO) -> Iterator[bytes]:
    """Read an already opened file, so removing its round midway does not cut the body."""
    try:
        yield from iter(lambda: fh.read(CHUNK), b"")
    finally:
        fh.close()


def _weights_response(directory: Path) -> Response:
    """The weights of one checkpoint directory, labelled with the round and hash that its
    meta.json records (the client checks the bytes against them)."""
    try:
        meta = read_meta(directory)
        fh = (directory / WEIGHTS).open("rb")
    except (CheckpointError, FileNotFoundError):
        return _error(404, f"no global model weights in {directory.name}")
    except OSError as exc:
        return _error(500, f"cannot read the global model in {directory.name}: {exc}")
    headers = {
        "Content-Length": str(os.fstat(fh.fileno()).st_size),
        "X-Meancache-Round": str(meta.round),
        "X-Meancache-Sha256": meta.sha256,
    }
    return StreamingResponse(_chunks(fh), media_type="application/octet-stream",
                             headers=headers)


def create_model_app(checkpoint_dir: Path) -> Starlette:
    """A Starlette app serving the checkpoints under ``checkpoint_dir``."""
    root = Path(checkpoint_dir)

    def newest() -> tuple[Path, GlobalModel] | None:
        directory = latest_checkpoint(root)
        return None if directory is None else (directory, read_meta(directory))

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def describe(request: Request) -> Response:
        try:
            found = newest()
        except CheckpointError as exc:
            return _error(500, str(exc))
        if found is None:
            return _error(404, NO_MODEL)
        meta = found[1]
        return JSONResponse({**meta.to_json(), "weights_url": weights_path(meta.round)})

    async def latest_weights(request: Request) -> Response:
        directory = latest_checkpoint(root)
        return _error(404, NO_MODEL) if directory is None else _weights_response(directory)

    async def round_weights(request: Request) -> Response:
        number: int = request.path_params["round"]
        if not 0 <= number <= MAX_ROUND:  # a 300-digit round makes no file name
            return _error(404, "no such round: round numbers run from 0 to "
                          f"{MAX_ROUND:,}")
        directory = round_dir(root, number)
        if not directory.is_dir():
            return _error(404, f"the FL server no longer keeps round {number}")
        return _weights_response(directory)

    return Starlette(routes=[
        Route("/health", health),
        Route("/v1/global-model", describe),
        Route("/v1/global-model/weights", latest_weights),
        Route("/v1/global-model/rounds/{round:int}/weights", round_weights),
    ], middleware=[Middleware(GuardRequests)])
