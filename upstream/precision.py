"""The numeric precision the upstream serves a model in: ``float32`` as loaded,
``fp16-int8`` (upstream.compact_weights: float16 linear layers, an int8 output layer
with an exactly scored shortlist, a lossless bfloat16 embedding), which reads a third of
the bytes per decoded token and so decodes about 1.6x as fast on a CPU, or ``int4``
(Gemma 3 only): prompts as fp16-int8, decode steps through ONNX Runtime on 8-bit layers
and a 4-bit output layer (upstream.onnx_decode; the name is older than the widths), faster
again but not float32's next token every time (about 98% of steps, llama.cpp Q4_K_M 97%).
``auto`` picks the fastest of these that a model allows (``choose_precision``)."""

import logging
from typing import TYPE_CHECKING

from meancache.upstream.errors import ModelLoadError

if TYPE_CHECKING:  # torch and transformers load only when a model does (fast CLI start)
    from transformers import PreTrainedModel

log = logging.getLogger(__name__)

AUTO = "auto"
PRECISIONS = (AUTO, "float32", "fp16-int8", "int4")
# Architectures whose decode step upstream.onnx_decode writes (int4).
INT4_ARCHITECTURES = ("gemma3_text",)
# What `upstream serve`, the chat's embedded upstream and `ask`'s background one run:
# int4 on Gemma 3 decodes about as fast as llama.cpp's Q4_K_M on the same GGUF (53.4
# against 52.1 tokens/s, fp16-int8 27.7, float32 19.5; benchmarks/generation_speed.py),
# and the chat with it holds 1,977 MB after one answer, within its 2,560 MB target
# (fp16-int8 1,694, float32 1,948; benchmarks/chat_memory.py, docs/upstream.md).
DEFAULT_PRECISION = AUTO

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


def choose_precision(model: "PreTrainedModel", precision: str) -> str:
    """The precision ``precision`` names for ``model``: itself, or for ``auto`` int4 where
    its architecture has a decode graph, else fp16-int8 where its output layer is linear
    (what compacting needs), else float32; float32 off the CPU too (the packed kernels
    are CPU ones)."""
    if check_precision(precision) != AUTO:
        return precision
    import torch

    model_type = model.config.model_type
    if next(model.parameters()).device.type != "cpu":
        chosen, why = "float32", "not on the CPU, whose kernels the others use"
    elif model_type in INT4_ARCHITECTURES:
        chosen, why = "int4", "decode steps on ONNX Runtime"
    elif isinstance(model.get_output_embeddings(), torch.nn.Linear):
        chosen, why = "fp16-int8", f"no int4 decode graph for {model_type}"
    else:
        chosen, why = "float32", "no linear output layer to compact"
    log.info("precision auto: %s for %s (%s)", chosen, model_type, why)
    return chosen


def apply_precision(model: "PreTrainedModel", precision: str) -> None:
    """Prepare ``model``'s weights in place for serving in ``precision``, as chosen by
    choose_precision (int4's decoder
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
