"""Fetching the FL server's newest global model, so a device that never took part in a
round (a new user) starts from what the federation learned.

The description the server sends (round, threshold, the weights' sha256) must carry the
FL server's Ed25519 signature under the key the device trusts (``fl_server_public_key``, or
`fl sync --server-key`); without a key, or with a wrong or missing signature, nothing is
installed and the threshold is not touched. Only ``fl_allow_unsigned`` (`--allow-unsigned`,
for a lab) installs an unverified model, with a warning. A verified model must also be
fresh (shared.fl.freshness, TUF's rollback and freeze-attack rules): signed with a time
and an expiry that has not passed, and no older than the round installed or already seen
(the record of the highest kept beside the device's global models), unless the user
allows a downgrade (``allow_downgrade``, `--allow-downgrade`). The weights are downloaded into
a temporary directory inside the device's global-model dir, checked against the signed
sha256 and only then installed with a rename and a LATEST pointer swap
(shared.fl.checkpoint.install_checkpoint): a broken or tampered download never replaces
the model the device already has. The global threshold of every cache on the device, and
the error-bound evidence the federation pooled (shared.fl.bound_evidence: the verifier's
labels and the cosine's, signed with the rest), are updated at once
(client.fl.device.DeviceState); the encoder switches to the new weights the next time
the cache opens (client.encoder.load_device_encoder, which also refuses
weights trained from a different base model and keeps the base model then). A global model
holding verifier weights is exported here as this device's int8 verifier
(client.verifier), which the caches use from their next start.

Downloads stay on the configured server (redirects are refused, and a ``weights_url`` must
be a path on it), are capped in size (the description at MAX_DESCRIPTION_BYTES, the weights
at ``max_weights_bytes``), and weights holding NaN or infinity are refused like a bad hash.
Only the newest KEEP_ROUNDS global models stay on the device.

Blocking (sync httpx): callers run it in a worker thread.
"""

import hashlib
import json
import logging
import os
import shutil
import ssl
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
from meancache.client.config import Settings
from meancache.client.errors import SyncError
from meancache.client.fl.device import KEEP_ROUNDS, DeviceState, pooled_bound
from meancache.client.fl.transport import http_verify
from meancache.client.fl.trust import accept_fresh, trusted_key
from meancache.client.http_errors import error_message
from meancache.shared.errors import CheckpointError, VerifierError
from meancache.shared.fl.checkpoint import (
    META,
    WEIGHTS,
    GlobalModel,
    install_checkpoint,
    latest_checkpoint,
    prune_rounds,
    read_meta,
)
from meancache.shared.fl.signing import verify
from meancache.shared.progress import Progress
from meancache.shared.threshold import check_threshold
from safetensors import SafetensorError

log = logging.getLogger(__name__)

META_PATH = "/v1/global-model"
CHUNK = 1 << 16
MAX_DESCRIPTION_BYTES = 1 << 16
MAX_WEIGHTS_BYTES = 2 << 30  # all of MPNet's weights take 0.4 GiB


@dataclass(frozen=True)
class SyncResult:
    round: int
    threshold: float
    sha256: str
    changed: bool  # False: the device already had exactly this global model
    path: Path  # the installed checkpoint directory


@dataclass(frozen=True)
class _Remote:
    meta: GlobalModel
    weights_url: str


def sync_global_model(url: str, settings: Settings, progress: Progress | None = None,
                      timeout: float = 30.0, max_weights_bytes: int = MAX_WEIGHTS_BYTES
                      ) -> SyncResult:
    """Install the FL server's newest global model on this device unless it has it.

    ``progress(done_bytes, total_bytes)`` follows the download (total is 0 while the
    server does not say). Raises SyncError for the server's side, CheckpointError for a
    download that does not match its hash or cannot be stored.
    """
    base = url.rstrip("/")
    root = settings.global_model_dir
    verify_tls = http_verify(base, settings.fl_certificate, settings.fl_insecure)
    server_key = trusted_key(settings)
    with _client(base, timeout, verify_tls) as http:
        remote = _fetch_meta(http, base)
        installed = _installed(root)
        if server_key is not None:
            verify(remote.meta, server_key)
            accept_fresh(remote.meta, installed[1].round if installed else None, settings)
        else:
            warning = (f"warning: installing the global model of round {remote.meta.round} "
                       f"from {base} unverified (fl_allow_unsigned): whoever can change what "
                       "that server sends chooses this device's model and threshold")
            log.warning(warning)
            print(warning, file=sys.stderr, flush=True)
        if installed is not None and _same(installed[1], remote.meta):
            path, changed = installed[0], False
        elif installed is not None and installed[1].sha256 == remote.meta.sha256:
            path, changed = _relabel(root, installed[0], remote.meta), True  # same weights
        else:
            path, changed = _download(http, base, remote, root, progress,
                                      max_weights_bytes), True
    prune_rounds(root, KEEP_ROUNDS)
    device = DeviceState(settings)
    device.set_global_threshold(remote.meta.threshold)
    device.set_pooled_bound(remote.meta.bound, remote.meta.cosine_bound)
    if remote.meta.verifier_base:
        _make_verifier(settings, path)
    if changed:
        log.info("installed global model of round %d (threshold %.4f) from %s",
                 remote.meta.round, remote.meta.threshold, base)
    return SyncResult(remote.meta.round, remote.meta.threshold, remote.meta.sha256, changed,
                      path)


def _make_verifier(settings: Settings, checkpoint: Path) -> None:
    """The global verifier as this device's int8 file (client.verifier); one trained from
    another base verifier is not used, and the sync still succeeds for the rest."""
    from meancache.client.verifier import export_global_verifier

    try:
        export_global_verifier(settings, checkpoint)
    except VerifierError as exc:
        log.warning("%s", exc)
        print(f"warning: {exc}", file=sys.stderr, flush=True)



# talking to the server -------------------------------------------------------------------
def _client(base: str, timeout: float, verify: ssl.SSLContext | bool) -> httpx.Client:
    # Not client.upstream_client, which every request to the upstream goes through: this is
    # another server (the FL server's global-model endpoint, fl_server_url), trusted through
    # the FL CA, never followed through a redirect, and failing with SyncError.
    try:
        return httpx.Client(base_url=base, timeout=httpx.Timeout(timeout),
                            follow_redirects=False, verify=verify)
    except (httpx.InvalidURL, ValueError) as exc:
        raise SyncError(f"{base!r} is not a usable FL server URL ({exc})") from None


def _unreachable(base: str, exc: Exception) -> SyncError:
    return SyncError(f"cannot reach the FL server at {base} ({str(exc) or type(exc).__name__})")


def _check_status(response: httpx.Response, base: str) -> None:
    """Turn a non-2xx answer into a SyncError with the server's own message."""
    if response.is_success:
        return
    if response.is_redirect:
        raise SyncError(f"the FL server at {base} redirected {response.request.url.path} to "
                        f"{response.headers.get('Location')!r}; meancache downloads only from "
                        "the server it is configured with")
    response.read()
    raise SyncError(f"the FL server at {base} answered {response.status_code} for "
                    f"{response.request.url.path}: {error_message(response)}")




def _fetch_meta(http: httpx.Client, base: str) -> _Remote:
    try:
        with http.stream("GET", META_PATH) as response:
            if response.status_code == 404:
                raise SyncError(f"the FL server at {base} has no global model yet")
            _check_status(response, base)
            text = b""
            for chunk in response.iter_bytes(CHUNK):
                text += chunk
                if len(text) > MAX_DESCRIPTION_BYTES:
                    raise SyncError(f"the FL server at {base} sent a global-model description "
                                    f"of more than {MAX_DESCRIPTION_BYTES} bytes")
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise _unreachable(base, exc) from None
    try:
        body = json.loads(text)
    except ValueError:
        raise SyncError(f"the FL server at {base} sent a global-model description that is "
                        "not JSON") from None
    return _parse_meta(body, base)


def _parse_meta(body: Any, base: str) -> _Remote:
    """Validate the description: its round names a directory and its hash is compared."""
    def invalid(why: str) -> SyncError:
        return SyncError(f"the FL server at {base} sent an invalid global-model description "
                         f"({why})")

    if not isinstance(body, dict):
        raise invalid("not a JSON object")
    number, threshold, sha = body.get("round"), body.get("threshold"), body.get("sha256")
    if not isinstance(number, int) or isinstance(number, bool) or number < 0:
        raise invalid(f"round {number!r}")
    try:
        check_threshold(threshold)
    except ValueError as exc:
        raise invalid(str(exc)) from None
    if not isinstance(sha, str) or len(sha) != 64 or set(sha) - set("0123456789abcdef"):
        raise invalid(f"sha256 {sha!r}")
    try:
        meta = GlobalModel(number, float(threshold), sha, str(body["base_model"]),
                           int(body["top_layers"]), dict(body.get("metrics") or {}),
                           float(body.get("created") or 0.0), str(body.get("signature") or ""),
                           _seconds(body.get("signed_at")), _seconds(body.get("expires")),
                           str(body.get("verifier_base") or ""), body.get("bound") or {},
                           body.get("cosine_bound") or {})
        pooled_bound(meta.bound)
        pooled_bound(meta.cosine_bound)
    except (KeyError, TypeError, ValueError, CheckpointError) as exc:
        raise invalid(f"{type(exc).__name__}: {exc}") from None
    weights_url = body.get("weights_url") or f"{META_PATH}/rounds/{number}/weights"
    if not isinstance(weights_url, str):
        raise invalid(f"weights_url {weights_url!r}")
    parts = urlsplit(weights_url)
    if parts.scheme or parts.netloc or not weights_url.startswith("/"):
        raise invalid(f"weights_url {weights_url!r} is not a path on this server")
    return _Remote(meta, weights_url)


def _seconds(value: Any) -> float:
    """A signing time or expiry as sent (absent: 0, which check_fresh refuses)."""
    if value is None:
        return 0.0
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 <= value < 1e11):  # finite, and before the year 5138
        raise ValueError(f"signing time {value!r}")
    return float(value)


# the device's side -----------------------------------------------------------------------
def _installed(root: Path) -> tuple[Path, GlobalModel] | None:
    """The checkpoint LATEST names, or None; a damaged one is simply replaced."""
    directory = latest_checkpoint(root)
    if directory is None:
        return None
    try:
        return directory, read_meta(directory)
    except CheckpointError as exc:
        log.warning("replacing the installed global model: %s", exc)
        return None


def _same(installed: GlobalModel, remote: GlobalModel) -> bool:
    """Nothing to do: the same weights of the same round with the same threshold."""
    return (installed.sha256, installed.round, installed.threshold) == (
        remote.sha256, remote.round, remote.threshold)


def _staging(root: Path) -> Path:
    """A fresh temporary directory on the same filesystem, so installing is a rename."""
    tmp = root / f".download-{os.getpid()}"
    try:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as exc:
        raise CheckpointError(f"cannot store a global model in {root}: {exc}") from None
    return tmp


def _install(root: Path, tmp: Path, meta: GlobalModel) -> Path:
    try:
        (tmp / META).write_text(json.dumps(meta.to_json(), indent=2))
        return install_checkpoint(root, tmp, meta.round)
    except OSError as exc:
        raise CheckpointError(f"cannot install the global model in {root}: {exc}") from None


def _relabel(root: Path, current: Path, meta: GlobalModel) -> Path:
    """Same weights under a new round or threshold: copy them locally, download nothing."""
    tmp = _staging(root)
    try:
        shutil.copyfile(current / WEIGHTS, tmp / WEIGHTS)
        return _install(root, tmp, meta)
    except OSError as exc:
        raise CheckpointError(f"cannot copy the global model in {current}: {exc}") from None
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _download(http: httpx.Client, base: str, remote: _Remote, root: Path,
              progress: Progress | None, max_bytes: int) -> Path:
    tmp = _staging(root)
    try:
        digest = _fetch_weights(http, base, remote, tmp / WEIGHTS, progress, max_bytes)
        if digest != remote.meta.sha256:
            raise CheckpointError(
                f"the global model of round {remote.meta.round} downloaded from {base} does "
                f"not match its sha256 (expected {remote.meta.sha256}, got {digest}); the "
                "installed model was kept")
        _check_weights(tmp / WEIGHTS, remote.meta.round, base)
        return _install(root, tmp, remote.meta)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # gone already once installed


def _check_weights(path: Path, round_number: int, base: str) -> None:
    """CheckpointError unless the file is safetensors holding only finite values. (torch
    is imported here, by a sync, not by the chat that merely offers one.)"""
    from meancache.shared.fl.weights import check_finite
    from safetensors.torch import load_file

    try:
        check_finite(load_file(str(path)))
    except (ValueError, OSError, SafetensorError) as exc:
        raise CheckpointError(f"the global model of round {round_number} from {base} is not "
                              f"usable ({exc}); the installed model was kept") from None


def _too_big(base: str, max_bytes: int) -> SyncError:
    return SyncError(f"the global model from {base} is larger than {max_bytes} bytes; "
                     "refused")


def _fetch_weights(http: httpx.Client, base: str, remote: _Remote, target: Path,
                   progress: Progress | None, max_bytes: int) -> str:
    """Stream the weights into ``target``; the sha256 of what was received."""
    digest = hashlib.sha256()
    try:
        with http.stream("GET", remote.weights_url) as response:
            _check_status(response, base)
            total = int(response.headers.get("Content-Length") or 0)
            if total > max_bytes:
                raise _too_big(base, max_bytes)
            done = 0
            with target.open("wb") as fh:
                if progress:
                    progress(0, total)
                for chunk in response.iter_bytes(CHUNK):
                    done += len(chunk)
                    if done > max_bytes:
                        raise _too_big(base, max_bytes)
                    fh.write(chunk)
                    digest.update(chunk)
                    if progress:
                        progress(done, total)
            if progress and not total:
                progress(done, done)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        raise SyncError(f"the download from the FL server at {base} failed "
                        f"({str(exc) or type(exc).__name__})") from None
    except OSError as exc:
        raise CheckpointError(f"cannot write the global model to {target}: {exc}") from None
    return digest.hexdigest()

