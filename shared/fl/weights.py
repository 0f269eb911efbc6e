"""The federated part of the encoder: every transformer weight, or only the top N layers.

Sending only the top layers (and the pooler) cuts each message by the share of the frozen
layers; the frozen ones come from the base model every device already has.

The embedding module (word, position and token-type tables) never travels, whatever the
number of layers: the rows of the word-embedding table that a device's training changed
are exactly the tokens its users typed.
"""

import re
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import torch
from meancache.shared.fl.checkpoint import VERIFIER

if TYPE_CHECKING:  # the type only: importing sentence-transformers costs seconds
    from sentence_transformers import SentenceTransformer

_LAYER = re.compile(r"\.encoder\.layer\.(\d+)\.")
_EMBEDDINGS = ".embeddings."


def federated_names(model: "SentenceTransformer", top_layers: int = 0) -> list[str]:
    """Parameter names that are trained and sent; ``top_layers`` = 0 means every layer
    (the embeddings never)."""
    return federated_subset([name for name, _ in model.named_parameters()], top_layers)


def federated_subset(names: Iterable[str], top_layers: int = 0) -> list[str]:
    """The federated ones of a model's parameter ``names`` (federated_names' rule): the
    one rule whether the names come from a built model or from its weight files
    (shared.encoder.weights, the server's way)."""
    names = [name for name in names if _EMBEDDINGS not in name]
    if top_layers <= 0:
        return names
    layers = {int(m.group(1)) for name in names if (m := _LAYER.search(name))}
    if not layers:
        raise ValueError("this model has no numbered encoder layers to choose the top ones of")
    first = max(layers) + 1 - top_layers
    return [name for name in names
            if ((m := _LAYER.search(name)) and int(m.group(1)) >= first) or ".pooler." in name]


def federated_state(model: "SentenceTransformer", names: list[str]) -> dict[str, torch.Tensor]:
    params = dict(model.named_parameters())
    return {name: params[name].detach().cpu().contiguous().clone() for name in names}


def load_federated_state(model: "SentenceTransformer", state: dict[str, torch.Tensor]) -> None:
    """Overwrite the named parameters; every name must exist with the same shape."""
    params = dict(model.named_parameters())
    for name, value in state.items():
        target = params.get(name)
        if target is None or target.shape != value.shape:
            raise ValueError(f"global weights do not fit this model: {name}")
        with torch.no_grad():
            target.copy_(value.to(target.device, target.dtype))


@contextmanager
def training_only(model: "torch.nn.Module", names: list[str]) -> Iterator[None]:
    """Train only the parameters ``names`` of ``model`` within the block; after it, even
    when training failed, the model is in eval mode with every parameter trainable again,
    as it was handed over (a simulation reuses one model across clients)."""
    keep = set(names)
    for name, param in model.named_parameters():
        param.requires_grad_(name in keep)
    model.train()
    try:
        yield
    finally:
        model.eval()
        for param in model.parameters():
            param.requires_grad_(True)


def check_finite(state: dict[str, torch.Tensor]) -> None:
    """ValueError naming the first tensor holding NaN or infinity: such weights would turn
    every embedding into NaN (and, aggregated, poison every device)."""
    for name, value in state.items():
        if not torch.isfinite(value).all():
            raise ValueError(f"the weights hold non-finite values ({name})")


def verifier_names(model: "torch.nn.Module", top_layers: int) -> list[str]:
    """The verifier's trained and sent parameters: its top ``top_layers`` transformer
    layers and its head (the embeddings never)."""
    return verifier_subset([name for name, _ in model.named_parameters()], top_layers)


def verifier_subset(names: Iterable[str], top_layers: int) -> list[str]:
    """verifier_names' rule on the verifier's parameter ``names`` (from the network or
    from its int8 file: shared.verifier.federated.base_tensors)."""
    names = list(names)
    return [*federated_subset(names, top_layers),
            *(name for name in names if name.startswith("head."))]


def with_verifier(encoder: dict[str, torch.Tensor], verifier: dict[str, torch.Tensor]
                  ) -> dict[str, torch.Tensor]:
    """One federated state of both models (the verifier's names prefixed)."""
    return encoder | {VERIFIER + name: value for name, value in verifier.items()}


def split_verifier(state: dict[str, torch.Tensor]
                   ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(the encoder's tensors, the verifier's, unprefixed) of a federated state."""
    encoder = {k: v for k, v in state.items() if not k.startswith(VERIFIER)}
    verifier = {k[len(VERIFIER):]: v for k, v in state.items() if k.startswith(VERIFIER)}
    return encoder, verifier
