"""The numeric precision the upstream serves a model in: ``float32`` as loaded,
``fp16-int8`` (upstream.compact_weights: float16 linear layers, an int8 output layer
with an exactly scored shortlist, a lossless bfloat16 embedding), which reads a third of
the bytes per decoded token and so decodes about 1.6x as fast on a CPU, or ``int4``
(Gemma 3 only): prompts as fp16-int8, decode steps through ONNX Runtime on 8-bit layers
and a 4-bit output layer (upstream.onnx_decode; the name is older than the widths), faster
again but not float32's next token every time (about 98% of steps, llama.cpp Q4_K_M 97%)."""

import logging
from typing import TYPE_CHECKING

from meancache.upstream.errors import ModelLoadError

if TYPE_CHECKING:  # torch and transformers load only when a model does (fast CLI start)
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

PRECISIONS = ("float32", "fp16-int8", "int4")
# What `upstream serve` runs: next tokens as float32's (benchmarks/generation_speed.py)
# at about 1.6x the decode speed and 280 MB less memory. The chat's embedded upstream
# stays float32: beside the encoder, compacting leaves the chat at 2.6 GB resident, over
# its 2.5 GB target (benchmarks/chat_memory.py).
DEFAULT_PRECISION = "fp16-int8"

# How attention (K/V) states are held, computed and cached (upstream.kv_rounding,
# which has each format's error bound). float16 halves the bytes of every cached token at
# 2^-11 relative rounding, 8x finer than bfloat16's at the same size; int8 quarters them.
KV_FORMATS = ("float32", "float16", "bfloat16", "int8")
DEFAULT_KV_FORMAT = "float16"


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ModelLoadError(f"unknown precision {precision!r}; choose one of "
                             + ", ".join(PRECISIONS))
    return precision


def apply_precision(model: "PreTrainedModel", precision: str) -> None:
    """Prepare ``model``'s weights in place for serving in ``precision`` (int4's decoder
    is built by model_loading from the float32 weights, before this compacts them: the
    decoder rounds states with upstream.kv_rounding, which reads the formats here)."""
    if check_precision(precision) == "float32":
        return
    import torch
    from meancache.upstream.compact_weights import compact

    output = model.get_output_embeddings()
    if not isinstance(output, torch.nn.Linear):
        raise ModelLoadError(f"{precision} needs a linear output layer; "
                             f"{model.config.model_type} has {type(output).__name__}: "
                             "serve it in float32")
    compact(model, output)
