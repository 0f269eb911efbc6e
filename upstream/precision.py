"""The numeric precision the upstream serves a model in.

Decoding one token on a CPU reads every weight it multiplies by, so its speed is set by
bytes of weights per token. In Gemma 3 270M the output layer (the tied 262K-word
embedding) is 63% of them and most of a decode step's time. ``int8`` runs that layer on
int8 weights with fbgemm's dynamic quantisation (a quarter of the bytes; each call
quantises its input on the fly). The transformer layers stay float32: the keys and values
Prompt Cache keeps and reuses are computed exactly as before, and only the logits carry
int8 rounding (benchmarks/generation_speed.py measures how often the next token changes).

Measured on Gemma 3 270M, 2 cores: 19.2 -> 21.2 decode tokens/s, and the next token
differs from float32's after 11% of 200 prompts (fbgemm quantises a call's whole input
with one scale). So float32 stays the default and int8 is an opt-in (`--precision`).
"""

import logging
import warnings
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
    """Quantise ``model``'s output layer in place for ``precision`` (float32: as loaded)."""
    if check_precision(precision) == "float32":
        return model
    import torch

    output = model.get_output_embeddings()
    if not isinstance(output, torch.nn.Linear):
        raise ModelLoadError(f"int8 needs a linear output layer; {model.config.model_type} "
                             f"has {type(output).__name__}: serve it in float32")
    with warnings.catch_warnings():  # torch.ao's quantized tensors are marked deprecated
        warnings.simplefilter("ignore")
        from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

        # One scale per output row (word): the rows' norms differ too much for one scale.
        quantized = quantize_dynamic(torch.nn.Sequential(output),
                                     {torch.nn.Linear: per_channel_dynamic_qconfig})[0]
    model.set_output_embeddings(quantized)
    log.info("%s output layer quantised to int8 (%d x %d)", model.config.model_type,
             output.out_features, output.in_features)
    return model
