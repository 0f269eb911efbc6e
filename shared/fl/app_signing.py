"""Flower apps signed by the operator, so a device runs only an app its operator released.

A stock flwr SuperNode started with ``--trusted-entities FILE`` (YAML: key id ->
``ssh-ed25519`` public key) runs a FAB only when the FAB's ``verifications`` hold a non-empty
``valid_license`` entry and, under a key id it trusts, the JSON ``{"signature", "signed_at"}``
of an Ed25519 signature over flwr's ``create_message_to_sign(sha256(fab), signed_at)``
(flwr/supernode/start_client_internal.py, ``_verify_fab``). The operator signs the FAB once,
offline (`meancache fl sign-app`); the FL server's Fleet gateway attaches the signature to the
FAB it hands SuperNodes; `meancache fl join` writes the trusted-entities file from the
operator's public key. The key id is derived from the public key, so the gateway and the
devices agree on it with nothing else to configure.
"""

import base64
import hashlib
import json
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from flwr.supercore.primitives.asymmetric_ed25519 import create_message_to_sign
from meancache.shared.errors import AppSignatureError

# What the SuperNode requires besides a signature (any non-empty text).
VALID_LICENSE = "signed by the meancache operator's app key"
# A signature file is a few hundred bytes; anything larger is not one.
MAX_SIGNATURE_BYTES = 4096


@dataclass(frozen=True)
class AppSignature:
    """One operator signature of one FAB, kept as ``<fab_sha256>.json``."""

    fab_sha256: str
    key_id: str
    signature: str  # base64url, as flwr decodes it
    signed_at: int  # seconds since the epoch, the first 8 bytes of what is signed

    def verifications(self) -> dict[str, str]:
        """The FAB's ``verifications`` a stock SuperNode checks."""
        value = json.dumps({"signature": self.signature, "signed_at": self.signed_at})
        return {"valid_license": VALID_LICENSE, self.key_id: value}


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "meancache-operator-" + hashlib.sha256(raw).hexdigest()[:16]


def public_key_line(public: Ed25519PublicKey) -> str:
    """The ``ssh-ed25519 AAAA...`` line flwr's trusted entities hold."""
    return public.public_bytes(serialization.Encoding.OpenSSH,
                               serialization.PublicFormat.OpenSSH).decode()


def operator_key(path: Path) -> Ed25519PrivateKey:
    """The operator's app key at ``path`` (OpenSSH, as `ssh-keygen -t ed25519` writes it),
    made (0600, with ``path.pub``) on first use."""
    if path.exists() and not path.is_file():
        raise AppSignatureError(f"{path} is not a file: give --key the operator's private "
                                "key, or a path where one may be made")
    if path.is_file():
        try:
            key = serialization.load_ssh_private_key(path.read_bytes(), password=None)
        except OSError as exc:
            raise AppSignatureError(f"cannot read {path}: {exc.strerror}") from None
        except (ValueError, TypeError) as exc:
            raise AppSignatureError(f"{path} is not an unencrypted OpenSSH private key: "
                                    f"{exc}") from None
        if not isinstance(key, Ed25519PrivateKey):
            raise AppSignatureError(f"{path} is not an Ed25519 key (ssh-keygen -t ed25519)")
        return key
    key = Ed25519PrivateKey.generate()
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH,
                            serialization.NoEncryption())
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(pem)
        path.with_name(path.name + ".pub").write_text(public_key_line(key.public_key()) + "\n")
    except OSError as exc:
        raise AppSignatureError(f"cannot make the operator's key at {path}: "
                                f"{exc.strerror}") from None
    return key


def read_app_public_key(text: str) -> Ed25519PublicKey:
    """An ``ssh-ed25519`` line, or the path of a file holding one (the key's .pub)."""
    value = text.strip()
    if not value.startswith("ssh-") and Path(value).expanduser().is_file():
        value = Path(value).expanduser().read_text(errors="replace").strip()
    try:
        key = serialization.load_ssh_public_key(value.encode())
    except (ValueError, UnicodeError):
        key = None
    if not isinstance(key, Ed25519PublicKey):
        raise AppSignatureError(f"{text[:80]!r} is not the operator's app key (an "
                                "'ssh-ed25519 ...' line, or the .pub file holding it)")
    return key


def sign_fab(fab: bytes, key: Ed25519PrivateKey, signed_at: int | None = None
             ) -> AppSignature:
    digest = hashlib.sha256(fab).digest()
    when = int(time.time()) if signed_at is None else signed_at
    signature = key.sign(create_message_to_sign(digest, when))
    return AppSignature(fab_sha256=digest.hex(), key_id=key_id(key.public_key()),
                        signature=base64.urlsafe_b64encode(signature).decode().rstrip("="),
                        signed_at=when)


def save_signature(signature: AppSignature, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{signature.fab_sha256}.json"
    path.write_text(json.dumps(asdict(signature), indent=1) + "\n")
    return path


def find_signature(directory: Path, fab_sha256: str) -> AppSignature | None:
    """The signature kept for the FAB with this digest, or None (also for a file that is
    not one: the SuperNode then refuses the app, as for an unsigned one)."""
    if len(fab_sha256) != 64 or not all(c in "0123456789abcdef" for c in fab_sha256):
        return None
    path = directory / f"{fab_sha256}.json"
    try:
        if path.stat().st_size > MAX_SIGNATURE_BYTES:
            return None
        fields = json.loads(path.read_text())
        signature = AppSignature(fab_sha256=str(fields["fab_sha256"]),
                                 key_id=str(fields["key_id"]),
                                 signature=str(fields["signature"]),
                                 signed_at=int(fields["signed_at"]))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return signature if signature.fab_sha256 == fab_sha256 else None


def write_trusted_entities(path: Path, public: Ed25519PublicKey) -> Path:
    """flwr's ``--trusted-entities`` file trusting only the operator's key."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump({key_id(public): public_key_line(public)}))
    return path
