"""Serving Gemma-sized models with fewer bytes of weights (``--precision fp16-int8``).

Decoding one token on a CPU reads every weight it multiplies by, so its speed is set by
the bytes of weights per token: 1.07 GB in float32 for Gemma 3 270M, whose output layer
(the tied 262K-word embedding) is 63% of them. Each kind of weight gets the smallest form
that leaves the answers as they were (measured by benchmarks/generation_speed.py):

- transformer linear layers: float16 weights, float32 arithmetic (fbgemm). Weights that
  came from a bfloat16 or GGUF file are nearly all exact in float16. int8 here changed the
  next token after 1 decode step in 18 (and 1 in 60 with only attention in int8).
- output layer: int8 (fbgemm, one scale per word, 8-bit activations where the CPU's
  kernel does not saturate, else 7-bit) only to choose a shortlist; its ``SHORTLIST``
  best words are scored again with their exact rows, so the next token is float32's
  whenever float32's choice is on the shortlist. The int8 logits stand for the rest of
  the vocabulary when sampling.
- input embedding: stored in bfloat16 when every value is a bfloat16 (then lossless) and
  read back as float32; the output layer's exact rows come from the same table.

Prompts and decode steps run on the same weights, so Prompt Cache's reused module states
give the same answer as an uncached prompt within this precision, as in float32.
"""

import functools
import logging
import warnings

import torch
from torch.ao.quantization import (
    float16_dynamic_qconfig,
    per_channel_dynamic_qconfig,
    quantize_dynamic,
)

log = logging.getLogger(__name__)

SHORTLIST = 64  # output words re-scored exactly after the int8 output layer


def _quantize(module: torch.nn.Module, qconfig: object) -> torch.nn.Module:
    """fbgemm's dynamic quantisation of every nn.Linear in ``module``, in place."""
    with warnings.catch_warnings():  # torch.ao's quantized modules are marked deprecated
        warnings.simplefilter("ignore")
        return quantize_dynamic(module, {torch.nn.Linear: qconfig}, inplace=True)


@functools.cache
def activations_reduce_range() -> bool:
    """Whether int8 activations must keep to 7 bits on this CPU. fbgemm's AVX2 kernel adds
    pairs of u8 x s8 products in 16 bits (vpmaddubsw) and saturates on 8-bit activations,
    halving large logits; its VNNI kernel adds in 32 bits. 8-bit activations change the
    shortlist less often, so they are used wherever they are exact: found by one probe whose
    every pair of products saturates 16 bits (255 x 127 x 2), not by reading CPU flags
    (fbgemm may be told to take its AVX2 path on any CPU)."""
    probe = torch.nn.Linear(64, 1, bias=False)
    with torch.no_grad():
        probe.weight.fill_(1.0)
    packed = _quantize(torch.nn.Sequential(probe), per_channel_dynamic_qconfig)[0]
    ones = torch.ones(1, 64)
    full = torch.ops.quantized.linear_dynamic(ones, packed._packed_params._packed_params,
                                              reduce_range=False)
    saturates = bool((full - 64).abs().max() > 1)  # exact: 64, one step off at most
    if saturates:
        log.info("int8 kernel saturates 8-bit activations: output layer uses 7-bit ones")
    return saturates


class ShortlistOutput(torch.nn.Module):
    """An output layer whose int8 logits pick the words that ``rows`` (its exact weight
    rows, float32 or lossless bfloat16) then score exactly."""

    def __init__(self, output: torch.nn.Linear, rows: torch.Tensor) -> None:
        super().__init__()
        quantized = _quantize(torch.nn.Sequential(output), per_channel_dynamic_qconfig)[0]
        self.int8 = quantized._packed_params._packed_params
        self.register_buffer("rows", rows, persistent=False)
        self.shortlist = min(SHORTLIST, output.out_features)
        self.reduce_range = activations_reduce_range()

    def int8_logits(self, x: torch.Tensor) -> torch.Tensor:
        """The int8 logits that choose the shortlist (and stand for the other words)."""
        return torch.ops.quantized.linear_dynamic(x, self.int8, reduce_range=self.reduce_range)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.rescore(x, self.int8_logits(x))

    def rescore(self, x: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` (from any approximate output layer) with their ``shortlist`` best
        words scored exactly from ``x``, in place."""
        best = logits.topk(self.shortlist, dim=-1).indices
        exact = x.unsqueeze(-2) @ self.rows[best].to(x.dtype).transpose(-1, -2)
        return logits.scatter_(-1, best, exact.squeeze(-2))


class BFloat16Embedding(torch.nn.Module):
    """An input embedding kept in bfloat16 (half the bytes) whose values are all
    bfloat16 values, so reading them back as float32 is exact; ``scale`` is Gemma's
    sqrt(hidden size) factor, when the model has one."""

    def __init__(self, table: torch.Tensor, scale: torch.Tensor | None) -> None:
        super().__init__()
        self.register_buffer("table", table, persistent=False)
        self.scale = scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = torch.nn.functional.embedding(ids, self.table).float()
        return rows if self.scale is None else rows * self.scale


def _lossless_bfloat16(model: torch.nn.Module, output: torch.nn.Linear
                       ) -> torch.Tensor | None:
    """The tied embedding/output table in bfloat16, installed as the input embedding, if
    that changes neither a value nor what the embedding layer returns; else None."""
    embedding = model.get_input_embeddings()
    weight = output.weight
    if embedding.weight is not weight or not torch.equal(weight, weight.bfloat16().float()):
        return None
    table = weight.detach().bfloat16()
    replacement = BFloat16Embedding(table, getattr(embedding, "embed_scale", None))
    probe = torch.arange(min(weight.shape[0], 4096))[None]
    with torch.inference_mode():
        if not torch.equal(replacement(probe), embedding(probe)):
            return None  # an embedding layer that does more than look up and scale
    model.set_input_embeddings(replacement)
    return table


def compact(model: torch.nn.Module, output: torch.nn.Linear) -> None:
    """Give ``model`` (whose output layer is ``output``) the forms described above, in
    place."""
    table = _lossless_bfloat16(model, output)
    model.set_output_embeddings(ShortlistOutput(output, table if table is not None
                                                else output.weight.detach()))
    _quantize(model, float16_dynamic_qconfig)
    log.info("%s: float16 linear layers, int8 output with a %d-word exact shortlist, "
             "embedding in %s", model.config.model_type, SHORTLIST,
             "bfloat16 (lossless)" if table is not None else "float32")
