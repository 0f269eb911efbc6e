"""Freshness of what a device installs from the FL server (a global model, later a
verifier): the rules TUF gives its clients against rollback and freeze attacks (The Update
Framework specification, "Detailed client workflow": a new version must not be lower than
the trusted one, and expired metadata is refused; https://theupdateframework.github.io/
specification/latest/#detailed-client-workflow).

What is checked was signed (shared.fl.signing): its round, when it was signed and when the
signature expires. A device refuses

- anything without those signed fields (an older server's): accepting it would reopen the
  rollback the fields close;
- anything whose signed expiry has passed (a stale or frozen endpoint);
- a round below the one it has installed or has already seen (a replay of an older signed
  model), and a different content of the round it has seen that was signed before it (a
  version already replaced), unless the user allows a downgrade (``allow_downgrade``).

The highest version seen is a small record per kind in the device's FL state
(``<data dir>/fl/seen.json``), replaced atomically; only these functions read or write it.
"""

import datetime as dt
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

from meancache.shared.errors import FreshnessError
from meancache.shared.files import write_json_atomic
from meancache.shared.fl.signing import Signed, unsigned_fields

SEEN_FILE = "seen.json"
DOWNGRADE_HINT = "pass --allow-downgrade (allow_downgrade) to install it anyway"


@dataclass(frozen=True)
class Version:
    """One signed version of one kind, as a device remembers it."""

    round: int
    signed_at: float
    content: str  # sha256 of what was signed, less signature and signing times

    @classmethod
    def of(cls, meta: Signed) -> "Version":
        text = json.dumps(unsigned_fields(meta), sort_keys=True, separators=(",", ":"))
        return cls(meta.round, meta.signed_at, hashlib.sha256(text.encode()).hexdigest())


def _when(seconds: float) -> str:
    return dt.datetime.fromtimestamp(seconds, dt.UTC).isoformat(timespec="seconds")


def check_fresh(meta: Signed, installed_round: int | None, seen: Version | None,
                now: float, allow_downgrade: bool) -> None:
    """FreshnessError unless ``meta`` (already verified) may replace what the device has:
    ``installed_round`` (None: nothing installed) and the highest version ``seen``."""
    if meta.signed_at <= 0 or meta.expires <= 0:
        raise FreshnessError(f"refused {meta.label}: its signature covers no signing time "
                             "and expiry (an FL server older than this device), so a replay "
                             "of it cannot be told from the newest; upgrade the FL server")
    if meta.expires <= now:
        raise FreshnessError(f"refused {meta.label}: its signature expired at "
                             f"{_when(meta.expires)} (a stale or frozen FL server endpoint)")
    if allow_downgrade:
        return
    for have, what in ((installed_round, "has installed"),
                       (seen.round if seen else None, "has already seen")):
        if have is not None and meta.round < have:
            raise FreshnessError(f"refused {meta.label}: this device {what} round {have}, "
                                 f"and an older round is a rollback; {DOWNGRADE_HINT}")
    if (seen is not None and meta.round == seen.round and meta.signed_at < seen.signed_at
            and Version.of(meta).content != seen.content):
        raise FreshnessError(f"refused {meta.label} signed at {_when(meta.signed_at)}: this "
                             f"device has seen it replaced by a version signed at "
                             f"{_when(seen.signed_at)}; {DOWNGRADE_HINT}")


def newest(seen: Version | None, accepted: Signed, allow_downgrade: bool) -> Version:
    """What to remember after installing ``accepted``: the higher of the two, or
    ``accepted`` itself after a downgrade the user allowed (else every later sync of it
    would be refused again)."""
    version = Version.of(accepted)
    if seen is None or allow_downgrade:
        return version
    return max(seen, version, key=lambda v: (v.round, v.signed_at))


def read_seen(fl_dir: Path, kind: str) -> Version | None:
    """The highest version of ``kind`` this device has seen; None when none (or the
    record is unreadable: the installed round still bounds a rollback)."""
    try:
        entry = json.loads((fl_dir / SEEN_FILE).read_text()).get(kind)
        return Version(int(entry["round"]), float(entry["signed_at"]), str(entry["content"]))
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        return None


def write_seen(fl_dir: Path, kind: str, version: Version) -> None:
    """Remember ``version`` as the highest of ``kind`` (the other kinds' kept)."""
    path = fl_dir / SEEN_FILE
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        record = {}
    if not isinstance(record, dict):
        record = {}
    fl_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, record | {kind: asdict(version)}, durable=True)
