"""The verifier this device runs: the shipped int8 one, or the int8 file made on this
device from the newest kept global model's verifier weights (federated learning,
shared.verifier.federated). Chat, proxy and CLI load it here, so they agree on it.

A global model's ``verifier.`` tensors apply only over the int8 verifier they were trained
from (its sha256 is the signed ``verifier_base``): the float base is decoded from that
file (shared.verifier.dequantise), the global tensors are loaded over it, and the result
is exported and quantised as the shipped one was, into ``<fl dir>/verifier/<weights
sha256>/`` with a card naming the new file's hash. That export is made when the global
model is installed (`fl sync`, F7, a round's evaluation), never during a lookup; a start
only loads it, hash-checked like the shipped one (an open chat switches at its next
start). Anything missing or not fitting: the shipped verifier, with a warning in the log.
"""

import logging
import shutil
from functools import lru_cache
from pathlib import Path

from meancache.client.config import Settings
from meancache.shared.errors import CheckpointError, VerifierError
from meancache.shared.fl.checkpoint import (
    GlobalModel,
    latest_checkpoint,
    load_checkpoint,
    read_meta,
)
from meancache.shared.verifier.runtime import (
    ARTEFACT_DIR,
    CARD_FILE,
    Card,
    LearnedVerifier,
    read_card,
)

log = logging.getLogger(__name__)


def _export_dir(settings: Settings, meta: GlobalModel) -> Path:
    return settings.global_model_dir.parent / "verifier" / meta.sha256[:16]


def export_global_verifier(settings: Settings, checkpoint: Path, base: Path | None = None
                           ) -> Path | None:
    """The directory of the int8 verifier made from ``checkpoint``'s verifier weights over
    ``base`` (the shipped int8 verifier by default), made unless it exists; None when the
    checkpoint holds no verifier. VerifierError when it was trained from another base."""
    import torch
    from meancache.shared.fl.weights import load_federated_state, split_verifier
    from meancache.shared.verifier.dequantise import float_verifier
    from meancache.shared.verifier.federated import base_dir, export_int8

    meta = read_meta(checkpoint)
    if not meta.verifier_base:
        return None
    base = base_dir(base)
    card = read_card(base)
    if card.sha256 != meta.verifier_base:
        raise VerifierError(f"the global verifier of round {meta.round} was trained from the "
                            f"int8 verifier {meta.verifier_base[:16]}..., not this device's "
                            f"({card.sha256[:16]}...); the device keeps its own")
    out = _export_dir(settings, meta)
    if _loadable(out, meta):
        return out
    _, state = load_checkpoint(checkpoint)
    model = float_verifier(base)
    try:
        load_federated_state(model, split_verifier(state)[1])  # type: ignore[arg-type]
    except ValueError as exc:
        raise VerifierError(f"the global verifier of round {meta.round} does not fit this "
                            f"device's verifier ({exc})") from None
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with torch.no_grad():
        export_int8(model, tmp, card.threshold, max_tokens=card.max_tokens,
                    base=meta.verifier_base, global_model=meta.sha256, round=meta.round)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log.info("made the verifier of global round %d in %s", meta.round, out)
    return out


def _loadable(directory: Path, meta: GlobalModel) -> bool:
    """An export of exactly this global model, whole (its card names its weights)."""
    import json

    try:
        about = json.loads((directory / CARD_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return (isinstance(about, dict) and about.get("global_model") == meta.sha256
            and about.get("base") == meta.verifier_base)


@lru_cache(maxsize=2)
def _load(directory: Path) -> LearnedVerifier:
    """One session per export, whichever caches (chat, each proxy app) use it."""
    return LearnedVerifier.load(directory)


def load_device_verifier(settings: Settings) -> LearnedVerifier | None:
    """The verifier made from the newest kept global model; None where there is none (the
    matcher then loads the shipped one when it first needs it)."""
    directory = _device_dir(settings)
    return None if directory is None else _load(directory)


def device_verifier_card(settings: Settings) -> Card:
    """The card of the verifier this device runs (``load_device_verifier``'s, else the
    shipped one's), read without loading a model: what `cache stats` judges by."""
    return read_card(_device_dir(settings) or ARTEFACT_DIR)


def _device_dir(settings: Settings) -> Path | None:
    """The export of the newest kept global model's verifier, where it is whole."""
    checkpoint = latest_checkpoint(settings.global_model_dir)
    if checkpoint is not None:
        try:
            meta = read_meta(checkpoint)
            out = _export_dir(settings, meta)
            if meta.verifier_base and _loadable(out, meta):
                return out
        except (CheckpointError, VerifierError) as exc:
            log.warning("not using the global verifier in %s: %s", checkpoint, exc)
    return None
