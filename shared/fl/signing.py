"""Global checkpoints are signed by the FL server's Ed25519 key and verified by devices, so
a global model's integrity does not rest on a hash sent over the same connection as the
weights: whoever can change what the download endpoint serves (or sits between it and a
device) cannot make a device install weights the server did not publish.

The signature covers the whole of meta.json but the signature itself, sha256 of the
weights included. The server's key (``signing-key.pem``, owner-only) is made beside its
checkpoints on first use; operators hand ``signing-key.pub`` (one base64 line) to devices,
whose ``fl_server_public_key`` setting names it.
"""

import base64
import json
import os
from dataclasses import replace
from pathlib import Path

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from meancache.shared.errors import CheckpointError
from meancache.shared.fl.checkpoint import GlobalModel

PRIVATE_KEY = "signing-key.pem"
PUBLIC_KEY = "signing-key.pub"


def _payload(meta: GlobalModel) -> bytes:
    fields = meta.to_json()
    fields.pop("signature", None)
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


def sign(meta: GlobalModel, key: Ed25519PrivateKey) -> GlobalModel:
    return replace(meta, signature=base64.b64encode(key.sign(_payload(meta))).decode())


def verify(meta: GlobalModel, key: Ed25519PublicKey) -> None:
    """CheckpointError unless the FL server's key signed exactly this metadata."""
    try:
        key.verify(base64.b64decode(meta.signature, validate=True), _payload(meta))
    except (InvalidSignature, ValueError):
        raise CheckpointError(f"the global model of round {meta.round} is not signed by the "
                              "FL server's key (tampered, or from another server); it was "
                              "refused and the installed model kept") from None
