"""FL global weights over the base model: the version they make, from the checkpoint's
metadata alone, and the weights loaded (checked against their sha256) when no checked
export of them exists."""

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.shared.errors import EncoderError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer


def global_version(base_version: str, checkpoint: Path) -> str:
    """The version of the base model with FL global weights over it, from the checkpoint's
    metadata alone (its weights are loaded only when no checked export of them exists)."""
    from meancache.shared.fl.checkpoint import read_meta

    meta = read_meta(checkpoint)
    if meta.base_model != base_version:
        raise EncoderError(
            f"the global model in {checkpoint} was trained from base model {meta.base_model}, "
            f"not from this one ({base_version}); sync from an FL server that trains this "
            "base model, or set encoder_model to the one it trains"
        )
    if _verifier_only(checkpoint):
        return base_version  # the encoder is the base model's, whatever the verifier's
    return weights_version(base_version, meta.sha256)


def _verifier_only(checkpoint: Path) -> bool:
    """Whether the checkpoint's weights hold no encoder tensor, from the safetensors
    header alone (no torch: a start from a checked export stays without it); weights that
    cannot be read count as the encoder's, whose load then fails as it would."""
    from meancache.shared.fl.checkpoint import WEIGHTS, verifier_only
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(checkpoint / WEIGHTS), framework="numpy") as weights:
            return verifier_only(weights.keys())
    except (OSError, SafetensorError):
        return False


def weights_version(base_version: str, sha256: str) -> str:
    """The version of the base model with the global weights of this sha256 over it: what
    a device names it, and what the FL server names the cosine judge of a round by
    (fl_server.round_model) without a checkpoint to read."""
    return hashlib.sha256(f"{base_version}|{sha256}".encode()).hexdigest()[:16]


def load_global_weights(model: "SentenceTransformer", checkpoint: Path) -> None:
    """Load FL global weights over the base model (checked against their sha256)."""
    from meancache.shared.fl.checkpoint import load_checkpoint
    from meancache.shared.fl.weights import load_federated_state, split_verifier

    _, state = load_checkpoint(checkpoint)
    try:
        load_federated_state(model, split_verifier(state)[0])
    except ValueError as exc:
        raise EncoderError(f"the global model in {checkpoint} does not fit this encoder "
                           f"({exc}); sync one trained for it") from None
