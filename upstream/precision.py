"""The numeric precision the upstream serves a model in: ``float32`` as loaded, or
``int8`` decode steps (upstream.int8_decode: prompts and the Prompt Cache's module states
stay float32; one-token steps read int8 copies of the weights, about twice as fast on a
CPU)."""

import logging
from typing import TYPE_CHECKING

from meancache.upstream.errors import ModelLoadError

if TYPE_CHECKING:  # torch and transformers load only when a model does (fast CLI start)
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

PRECISIONS = ("float32", "int8")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ModelLoadError(f"unknown precision {precision!r}; choose one of "
                             + ", ".join(PRECISIONS))
    return precision


def apply_precision(model: "PreTrainedModel", precision: str) -> "PreTrainedModel":
    """Prepare ``model`` in place for serving in ``precision``."""
    if check_precision(precision) == "float32":
        return model
    import torch
    from meancache.upstream.int8_decode import add_int8_copies

    output = model.get_output_embeddings()
    if not isinstance(output, torch.nn.Linear):
        raise ModelLoadError(f"int8 needs a linear output layer; {model.config.model_type} "
                             f"has {type(output).__name__}: serve it in float32")
    wrapped = add_int8_copies(model, output)
    log.info("%s: int8 copies of %d linear layers for decode steps",
             model.config.model_type, wrapped)
    return model
