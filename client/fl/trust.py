"""What a device trusts of the FL server's global models, however they arrive (`fl sync`
from the model endpoint, or the message of a Flower round): the server's Ed25519
signature under the key the device was given (``fl_server_public_key``; none and no
``fl_allow_unsigned``: nothing is installed), and freshness (shared.fl.freshness, TUF's
rollback and freeze rules) against the device's one record of the versions it has seen.
"""

import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from meancache.client.config import Settings
from meancache.client.errors import SyncError
from meancache.shared.errors import CheckpointError
from meancache.shared.fl.checkpoint import GlobalModel, latest_checkpoint, read_meta
from meancache.shared.fl.freshness import check_fresh, newest, read_seen, write_seen
from meancache.shared.fl.signing import PUBLIC_KEY, read_public_key

SEEN_KIND = "global-model"  # its entry in the device's record of versions seen


def trusted_key(settings: Settings) -> Ed25519PublicKey | None:
    """The FL server's key this device verifies global models with; None only when the
    user allowed unsigned models and set no key. No key otherwise: SyncError, before
    anything is downloaded or kept."""
    if settings.fl_server_public_key:
        return read_public_key(settings.fl_server_public_key)
    if settings.fl_allow_unsigned:
        return None
    raise SyncError(f"refusing to install a global model nobody can verify: set "
                    f"fl_server_public_key (or pass `fl sync --server-key`) to the FL "
                    f"server's {PUBLIC_KEY}, or pass --allow-unsigned (fl_allow_unsigned) to "
                    "accept unsigned models in a lab; the installed model was kept")


def installed_round(root: Path) -> int | None:
    """The round of the global model LATEST names under ``root``; None when none (or it
    is damaged: it is simply replaced)."""
    directory = latest_checkpoint(root)
    if directory is None:
        return None
    try:
        return read_meta(directory).round
    except CheckpointError:
        return None


def accept_fresh(meta: GlobalModel, installed: int | None, settings: Settings) -> None:
    """FreshnessError for a stale model (shared.fl.freshness) against the ``installed``
    round and the record of the newest seen; otherwise it is remembered as seen at once,
    so an installation that fails after it still bars an older one."""
    fl_dir = settings.global_model_dir.parent
    seen = read_seen(fl_dir, SEEN_KIND)
    check_fresh(meta, installed, seen, time.time(), settings.allow_downgrade)
    remembered = newest(seen, meta, settings.allow_downgrade)
    if remembered != seen:
        try:
            write_seen(fl_dir, SEEN_KIND, remembered)
        except OSError as exc:
            raise CheckpointError(f"cannot record the global model seen in {fl_dir}: "
                                  f"{exc}") from None
