"""The learned verifier in federated learning: the base both sides start from, the tensors
that travel, its local training, and the int8 file a device makes from a global model.

The base is the float model decoded from an int8 verifier (shared.verifier.dequantise):
the shipped one, or the directory the run config's ``verifier-model`` names. Its identity
is that file's sha256 (the card's): a global model records it (``verifier_base``), so a
device applies global verifier weights only over the file they were trained from.

Imports torch: training and export only, never a lookup.
"""

import json
import random
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.shared.pairs import Pair
from meancache.shared.verifier.runtime import ARTEFACT_DIR, CARD_FILE, MODEL_FILE, read_card
from meancache.shared.verifier.tokens import MAX_TOKENS

if TYPE_CHECKING:
    import numpy as np
    import torch
    from meancache.shared.verifier.model import CrossEncoder


def base_dir(directory: Path | None) -> Path:
    """Where the int8 base lives (the shipped artefact when none is named)."""
    return directory or ARTEFACT_DIR


def base_sha(directory: Path | None) -> str:
    """The identity of the base: its int8 file's sha256, as its card pins it."""
    return read_card(base_dir(directory)).sha256


@cache
def base_verifier(directory: Path | None) -> "CrossEncoder":
    """One float base per process (a simulation reuses processes across clients); every
    message overwrites its federated weights before use."""
    from meancache.shared.verifier.dequantise import float_verifier

    return float_verifier(base_dir(directory))


def base_tensors(directory: Path | None) -> "dict[str, torch.Tensor]":
    """The base's float tensors by parameter name, without building the network: what the
    FL server starts from (it averages tensors and never runs the verifier)."""
    import numpy as np
    import torch
    from meancache.shared.verifier.dequantise import checked_float_state

    state, _ = checked_float_state(base_dir(directory))
    return {name: torch.from_numpy(np.array(value, dtype=np.float32))
            for name, value in state.items()}


def train_verifier(model: "CrossEncoder", pairs: list[Pair], names: list[str], epochs: int,
                   batch: int, learning_rate: float, seed: int, max_tokens: int = MAX_TOKENS
                   ) -> float:
    """Fine-tune the named parameters in place on labelled pairs (binary cross-entropy on
    the logit, each pair read in either order, as the shipped verifier was trained:
    shared.verifier.train); returns the mean loss."""
    import torch
    from meancache.shared.fl.weights import training_only
    from meancache.shared.verifier.train import batches, train_step

    rng = random.Random(seed)
    rows = [(p.q1, p.q2, p.label) for p in pairs]
    total, steps = 0.0, 0
    with training_only(model, names):
        optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                      lr=learning_rate, weight_decay=0.01)
        schedule = torch.optim.lr_scheduler.LambdaLR(optimiser, lambda _: 1.0)
        for _ in range(epochs):
            for chunk in batches(rows, batch, rng):
                total += train_step(model, [(a, b, float(y)) for a, b, y in chunk],
                                    max_tokens, None, False, optimiser, schedule)
                steps += 1
    return total / max(steps, 1)


def pair_probabilities(model: "CrossEncoder", pairs: list[Pair], batch: int = 32,
                       max_tokens: int = MAX_TOKENS) -> "np.ndarray":
    """P(same question) of each pair by the float model (a simulated device's judge: the
    error-bound evidence it sends is of these scores, as a device's is of its int8
    verifier's)."""
    import numpy as np
    import torch
    from meancache.shared.verifier.tokens import tokenize_pairs

    out = []
    with torch.no_grad():
        for start in range(0, len(pairs), batch):
            chunk = pairs[start:start + batch]
            tokens = tokenize_pairs([p.q1 for p in chunk], [p.q2 for p in chunk], max_tokens)
            logits = model(*(torch.from_numpy(x) for x in (
                tokens.input_ids, tokens.attention_mask, tokens.token_type_ids)))
            out.append(torch.sigmoid(logits.float()).numpy())
    return np.concatenate(out) if out else np.zeros(0, dtype=np.float32)


def export_int8(model: "CrossEncoder", out: Path, threshold: float, **about: object
                ) -> Path:
    """``out`` holding the model as int8 ONNX, made as the shipped one is
    (shared.verifier.model), and its card naming the new file's sha256; returns ``out``."""
    from meancache.shared.files import sha256_file
    from meancache.shared.verifier.model import export_onnx, quantize_int8

    out.mkdir(parents=True, exist_ok=True)
    full = out / "verifier-float32.onnx"
    export_onnx(model, full)
    quantize_int8(full, out / MODEL_FILE)
    full.unlink()
    card = {"sha256": sha256_file(out / MODEL_FILE), "threshold": threshold, **about}
    (out / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return out

