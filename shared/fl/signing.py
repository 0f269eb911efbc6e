"""Global checkpoints are signed by the FL server's Ed25519 key and verified by devices, so
a global model's integrity does not rest on a hash sent over the same connection as the
weights: whoever can change what the download endpoint serves (or sits between it and a
device) cannot make a device install weights the server did not publish.

The signature covers the whole of meta.json but the signature itself, sha256 of the
weights included, and with it the round, when it was signed and when it expires (what a
device's rollback and freeze checks read, shared.fl.freshness). Anything with those fields
(``Signed``: a global model, a verifier) is signed and verified alike. The server's key
(``signing-key.pem``, owner-only) is made beside its checkpoints on first use; operators
hand ``signing-key.pub`` (one base64 line) to devices, whose ``fl_server_public_key``
setting names it.
"""

import base64
import json
import os
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Protocol, TypeVar

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from meancache.shared.errors import CheckpointError

PRIVATE_KEY = "signing-key.pem"
PUBLIC_KEY = "signing-key.pub"
FRESHNESS = ("signed_at", "expires")
# How long a signature holds: the model endpoint signs what it serves afresh at every
# request (fl_server.model_endpoint), so only a stale or frozen endpoint's answers age.
LIFETIME_SECONDS = 7 * 24 * 3600.0


class Signed(Protocol):
    """Metadata the FL server signs and a device installs (a dataclass)."""

    round: int
    signature: str
    signed_at: float
    expires: float

    @property
    def label(self) -> str: ...

    def to_json(self) -> dict[str, Any]: ...


S = TypeVar("S", bound=Signed)


def unsigned_fields(meta: Signed) -> dict[str, Any]:
    """What is signed, less the signature and the freshness fields: equal for two
    signings of the same content."""
    fields = meta.to_json()
    for name in ("signature", *FRESHNESS):
        fields.pop(name, None)
    return fields


def _payload(meta: Signed) -> bytes:
    fields = meta.to_json()
    fields.pop("signature", None)
    for name in FRESHNESS:  # absent (0) in metadata signed before they existed
        if not fields.get(name):
            fields.pop(name, None)
    return json.dumps(fields, sort_keys=True, separators=(",", ":")).encode()


def server_key(directory: Path) -> Ed25519PrivateKey:
    """The server's signing key in ``directory``, made (0600) with its .pub on first use."""
    path = directory / PRIVATE_KEY
    if path.is_file():
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise CheckpointError(f"{path} is not an Ed25519 private key")
        return key
    key = Ed25519PrivateKey.generate()
    directory.mkdir(parents=True, exist_ok=True)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    (directory / PUBLIC_KEY).write_text(public_key_text(key.public_key()) + "\n")
    return key


def public_key_text(key: Ed25519PublicKey) -> str:
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return base64.b64encode(raw).decode()


def read_public_key(text: str) -> Ed25519PublicKey:
    """A key as ``public_key_text`` writes it, or the path of a file holding one."""
    value = text.strip()
    if not value.endswith("=") and Path(value).expanduser().is_file():
        value = Path(value).expanduser().read_text().strip()
    try:
        return Ed25519PublicKey.from_public_bytes(base64.b64decode(value, validate=True))
    except ValueError:
        raise CheckpointError(f"{text!r} is not an FL server public key (the one line of its "
                              f"{PUBLIC_KEY}) nor a file holding one") from None


def sign(meta: S, key: Ed25519PrivateKey, now: float | None = None,
         lifetime: float = LIFETIME_SECONDS) -> S:
    """``meta`` signed at ``now`` (default: the time), expiring ``lifetime`` later."""
    when = time.time() if now is None else now
    fresh = replace(meta, signed_at=when, expires=when + lifetime)  # type: ignore[type-var]
    return replace(fresh, signature=base64.b64encode(key.sign(_payload(fresh))).decode())


def verify(meta: Signed, key: Ed25519PublicKey) -> None:
    """CheckpointError unless the FL server's key signed exactly this metadata."""
    try:
        key.verify(base64.b64decode(meta.signature, validate=True), _payload(meta))
    except (InvalidSignature, ValueError):
        raise CheckpointError(f"{meta.label} is not signed by the FL server's key (tampered, "
                              "or from another server); it was refused and the installed "
                              "model kept") from None
