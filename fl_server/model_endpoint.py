"""The FL server's newest global model over HTTP, so a new user starts from it.

Only checkpoints whose metadata verifies under the server's own key (shared.fl.signing)
are served: ``GET /v1/global-model`` describes the newest of them (by round, at or below
the one LATEST names; an unsigned or altered round is skipped with a warning in the log,
and with none left the answer is a 404 saying so) and names a round-specific
``weights_url``; a round's weights are served only when its metadata verifies.
``GET /v1/global-model/weights`` serves the newest verified weights directly. LATEST is
read at every request, so a round installed between the description and the download
cannot hand a client the weights of another round.

The description is signed afresh at each request (its round and content unchanged, a new
signing time and expiry): like TUF's timestamp role, the online key keeps a live
endpoint's answers fresh, so only a stale or frozen endpoint's answers expire on devices
(shared.fl.freshness).
"""

import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from meancache.shared.errors import CheckpointError
from meancache.shared.fl.checkpoint import (
    WEIGHTS,
    GlobalModel,
    latest_checkpoint,
    read_meta,
    round_dir,
)
from meancache.shared.fl.signing import server_key, sign, verify
from meancache.shared.http_limits import GuardRequests
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

log = logging.getLogger(__name__)

CHUNK = 1 << 20
NO_MODEL = "the FL server has no global model yet"
NO_SIGNED_MODEL = ("the FL server has no global model signed with its key (its checkpoints "
                   "are unsigned or altered; see its log)")


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


def _weights_response(directory: Path, meta: GlobalModel) -> Response:
    """The weights of one verified checkpoint directory, labelled with the round and hash
    its meta.json records (the client checks the bytes against them)."""
    try:
        fh = (directory / WEIGHTS).open("rb")
    except FileNotFoundError:
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


def _round_of(directory: Path) -> int | None:
    name = directory.name
    digits = name.removeprefix("round-")
    return int(digits) if name.startswith("round-") and digits.isdigit() else None


def create_model_app(checkpoint_dir: Path, key: Ed25519PrivateKey | None = None
                     ) -> Starlette:
    """A Starlette app serving the checkpoints under ``checkpoint_dir`` that ``key`` (the
    server's; default: the one beside the checkpoints, made on first use) signed."""
    root = Path(checkpoint_dir)
    signing_key = key if key is not None else server_key(root)
    public = signing_key.public_key()

    def verified(directory: Path) -> GlobalModel | None:
        """The metadata of a checkpoint the server signed, for the round its directory
        names; None (logged) for any other."""
        try:
            meta = read_meta(directory)
            verify(meta, public)
        except CheckpointError as exc:
            log.warning("not serving %s: %s", directory.name, exc)
            return None
        if meta.round != _round_of(directory):
            log.warning("not serving %s: it holds the signed metadata of round %d",
                        directory.name, meta.round)
            return None
        return meta

    def newest() -> tuple[Path, GlobalModel] | None:
        """The newest verified checkpoint at or below LATEST's round."""
        latest = latest_checkpoint(root)
        top = None if latest is None else _round_of(latest)
        if top is None:
            return None
        rounds = sorted((r, d) for d in root.glob("round-[0-9]*")
                        if (r := _round_of(d)) is not None and r <= top)
        for _, directory in reversed(rounds):
            if (meta := verified(directory)) is not None:
                return directory, meta
        return None

    def missing() -> JSONResponse:
        return _error(404, NO_MODEL if latest_checkpoint(root) is None else NO_SIGNED_MODEL)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def describe(request: Request) -> Response:
        found = newest()
        if found is None:
            return missing()
        meta = sign(found[1], signing_key)
        return JSONResponse({**meta.to_json(), "weights_url": weights_path(meta.round)})

    async def latest_weights(request: Request) -> Response:
        found = newest()
        return missing() if found is None else _weights_response(*found)

    async def round_weights(request: Request) -> Response:
        number: int = request.path_params["round"]
        if not 0 <= number <= MAX_ROUND:  # a 300-digit round makes no file name
            return _error(404, "no such round: round numbers run from 0 to "
                          f"{MAX_ROUND:,}")
        directory = round_dir(root, number)
        if not directory.is_dir():
            return _error(404, f"the FL server no longer keeps round {number}")
        meta = verified(directory)
        if meta is None:
            return _error(404, f"round {number} is not signed with the FL server's key; "
                          "it is not served")
        return _weights_response(directory, meta)

    return Starlette(routes=[
        Route("/health", health),
        Route("/v1/global-model", describe),
        Route("/v1/global-model/weights", latest_weights),
        Route("/v1/global-model/rounds/{round:int}/weights", round_weights),
    ], middleware=[Middleware(GuardRequests)])
