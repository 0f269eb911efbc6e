"""Global-model checkpoints: ``<root>/round-NNNN/`` with ``weights.safetensors`` (the
federated weights), ``meta.json`` (round, threshold, metrics, sha256 of the weights), and
``<root>/LATEST`` naming the newest. Written to a temporary directory and renamed, so a
crash never leaves a half checkpoint, and a download is checked against its hash."""

import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meancache.shared.errors import CheckpointError
from meancache.shared.files import sha256_file

if TYPE_CHECKING:  # reading the metadata (which model a device runs) needs no torch
    import torch

WEIGHTS = "weights.safetensors"
META = "meta.json"
LATEST = "LATEST"
# The verifier's tensors travel in the same record as the encoder's, under this prefix:
# one update, so screening, clipping, FedAvg, DP and the compression treat both at once.
VERIFIER = "verifier."
# The key of a Flower round's config record holding the server's signed description
# (a GlobalModel's JSON) of the global model the message carries.
DESCRIPTION_KEY = "global-model"


@dataclass(frozen=True)
class GlobalModel:
    round: int
    threshold: float
    sha256: str
    base_model: str  # fingerprint of the base encoder the weights apply to
    top_layers: int
    metrics: dict[str, float] = field(default_factory=dict)
    created: float = field(default_factory=time.time)
    signature: str = ""  # the FL server's Ed25519 signature (shared.fl.signing); "": none
    # Freshness, under the signature (shared.fl.signing.sign sets both; 0: an old
    # checkpoint's, which no device installs, see shared.fl.freshness).
    signed_at: float = 0.0  # seconds since the epoch
    expires: float = 0.0  # no device installs it after this
    # sha256 of the int8 verifier the weights' "verifier." tensors were trained from
    # (shared.verifier.dequantise); "": the verifier is not federated.
    verifier_base: str = ""
    # The error-bound evidence pooled from the devices' labels in the round
    # (shared.fl.bound_evidence, its ``to_record`` form), under the signature as the
    # threshold is; {}: none.
    bound: dict[str, Any] = field(default_factory=dict)
    # The same of the cosine's labels (caches with the learned verifier off), naming the
    # cosine's vector space as ``bound`` names its verifier; {}: none (as in a model
    # published before it existed, which carries one pool).
    cosine_bound: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        """What this is, in an error message."""
        return f"the global model of round {self.round}"

    def to_json(self) -> dict[str, Any]:
        """Its fields; ``verifier_base``, ``bound`` and ``cosine_bound`` only where set,
        so what a server signed before they existed verifies unchanged."""
        fields = asdict(self)
        for name in ("verifier_base", "bound", "cosine_bound"):
            if not fields[name]:
                del fields[name]
        return fields


def verifier_only(names: Iterable[str]) -> bool:
    """Whether weights of these tensor names leave the encoder as the base model is: none
    is the encoder's (run config train-encoder = 0, where the verifier alone is
    federated), so its vector space, and the cosine's judge, stay the base model's."""
    return all(name.startswith(VERIFIER) for name in names)


def state_sha256(state: "dict[str, torch.Tensor]") -> str:
    """sha256 of ``state`` as save_checkpoint writes it: what the description of weights
    sent in a Flower round names (the same bytes a checkpoint of them holds)."""
    from safetensors.torch import save

    return hashlib.sha256(save({k: v.contiguous() for k, v in state.items()})).hexdigest()


def round_dir(root: Path, round_number: int) -> Path:
    return root / f"round-{round_number:04d}"


def save_checkpoint(root: Path, round_number: int, state: "dict[str, torch.Tensor]",
                    threshold: float, base_model: str, top_layers: int,
                    metrics: dict[str, float] | None = None,
                    sign: Callable[[GlobalModel], GlobalModel] | None = None,
                    verifier_base: str = "", bound: dict[str, Any] | None = None,
                    cosine_bound: dict[str, Any] | None = None) -> GlobalModel:
    """``sign``: what turns the metadata into what is written: the server's signing
    (shared.fl.signing.sign with its key), or on a device the server's signed description
    of these same weights (checked against state_sha256 first). ``verifier_base`` and
    ``bound`` and ``cosine_bound``: see GlobalModel."""
    from safetensors.torch import save_file

    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".tmp-{round_number:04d}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / WEIGHTS))
    meta = GlobalModel(round_number, float(threshold), sha256_file(tmp / WEIGHTS), base_model,
                       top_layers, dict(metrics or {}), verifier_base=verifier_base,
                       bound=dict(bound or {}), cosine_bound=dict(cosine_bound or {}))
    if sign is not None:
        meta = sign(meta)
    (tmp / META).write_text(json.dumps(meta.to_json(), indent=2))
    install_checkpoint(root, tmp, round_number)
    return meta


def install_checkpoint(root: Path, prepared: Path, round_number: int) -> Path:
    """Move a complete checkpoint directory into place and point LATEST at it."""
    target = round_dir(root, round_number)
    if target.exists():
        shutil.rmtree(target)
    prepared.rename(target)
    pointer = root / f".{LATEST}.{os.getpid()}"
    pointer.write_text(target.name)
    pointer.replace(root / LATEST)
    return target


def prune_rounds(root: Path, keep: int) -> list[Path]:
    """Delete all but the newest ``keep`` round directories (a device needs the global
    model it uses, not every one it ever received); returns those deleted. The one
    LATEST names always stays."""
    latest = latest_checkpoint(root)
    rounds = sorted(root.glob("round-[0-9][0-9][0-9][0-9]"))
    old = [path for path in rounds[:-keep] if path != latest] if keep > 0 else []
    for path in old:
        shutil.rmtree(path, ignore_errors=True)
    return old


def latest_checkpoint(root: Path) -> Path | None:
    pointer = root / LATEST
    if not pointer.is_file():
        return None
    path = root / pointer.read_text().strip()
    return path if (path / META).is_file() else None


def read_meta(directory: Path) -> GlobalModel:
    try:
        return GlobalModel(**json.loads((directory / META).read_text()))
    except (OSError, ValueError, TypeError) as exc:
        raise CheckpointError(f"unreadable checkpoint metadata in {directory}: {exc}; delete "
                              "that directory and fetch or train the round again") from None


def load_checkpoint(directory: Path) -> "tuple[GlobalModel, dict[str, torch.Tensor]]":
    """Metadata and weights, after checking the weights against the recorded sha256."""
    meta = read_meta(directory)
    weights = directory / WEIGHTS
    if not weights.is_file() or sha256_file(weights) != meta.sha256:
        raise CheckpointError(f"the weights in {directory} do not match their sha256 (damaged or "
                              "altered); delete that directory and fetch or train the round "
                              "again")
    from safetensors.torch import load_file

    return meta, load_file(str(weights))
