"""int8 copies of a model's linear layers for one-token decode steps (``--precision int8``).

Decoding one token on a CPU reads every weight it multiplies by, so its speed is set by
the bytes of weights per token: 1.07 GB in float32 for Gemma 3 270M, whose output layer
(the tied 262K-word embedding) is 63% of them. A prompt is the opposite case: many tokens
per weight read, bound by arithmetic rather than bytes.

So only decode steps are quantised. Every linear layer keeps its float32 weights and gains
an int8 copy (fbgemm, one scale per output row; activations quantised per call, which in
a one-token step means per token). Prompts, and the module states Prompt Cache stores and
reuses, run on the float32 weights: they are exactly float32's, and a cached prompt still
equals an uncached one. Only the forward passes inside ``decoding(model)``
(PromptCacheEngine.decode_step) use the int8 copies.

The output layer's int8 logits only choose a shortlist: its ``SHORTLIST`` best words are
scored again with their float32 rows, so the next token is float32's whenever float32's
choice is on the shortlist and the hidden state has not drifted; the int8 logits stand for
the rest of the vocabulary when sampling. benchmarks/generation_speed.py measures the
speed and how often the next token still differs from float32's.

Memory: the int8 copies add a quarter of the linear layers' float32 bytes (the float32
embedding is kept anyway, to look up input tokens).
"""

import logging
import warnings
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch.ao.quantization import per_channel_dynamic_qconfig, quantize_dynamic

log = logging.getLogger(__name__)

SHORTLIST = 64  # output words re-scored in float32 after an int8 decode step


def _packed_int8(linear: torch.nn.Linear) -> torch.ScriptObject:
    """fbgemm's packed int8 weights (and bias) of ``linear``, one scale per output row:
    the rows' norms differ too much for one scale."""
    with warnings.catch_warnings():  # torch.ao's quantized modules are marked deprecated
        warnings.simplefilter("ignore")
        quantized = quantize_dynamic(torch.nn.Sequential(linear),
                                     {torch.nn.Linear: per_channel_dynamic_qconfig})[0]
    return quantized._packed_params._packed_params


class DecodeLinear(torch.nn.Module):
    """A linear layer that multiplies by its int8 copy inside ``decoding`` and by its
    float32 weights everywhere else. With ``shortlist`` > 0 (the output layer) the best
    int8 logits are recomputed in float32."""

    def __init__(self, linear: torch.nn.Linear, shortlist: int = 0) -> None:
        super().__init__()
        self.linear = linear
        self.int8 = _packed_int8(linear)
        self.shortlist = min(shortlist, linear.out_features)
        self.decoding = False

    @property
    def weight(self) -> torch.Tensor:  # transformers reads the (tied) output weight
        return self.linear.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.decoding:
            return self.linear(x)
        # reduce_range=False: 8-bit activations, not fbgemm's default 7 (which costs
        # next-token agreement); the VNNI kernels of the CPUs this targets do not saturate.
        y = torch.ops.quantized.linear_dynamic(x, self.int8, reduce_range=False)
        if self.shortlist:
            best = y.topk(self.shortlist, dim=-1).indices
            exact = x.unsqueeze(-2) @ self.linear.weight[best].transpose(-1, -2)
            y.scatter_(-1, best, exact.squeeze(-2))
        return y


def add_int8_copies(model: torch.nn.Module, output: torch.nn.Linear) -> int:
    """Wrap every linear layer of ``model`` in a DecodeLinear, in place (``output``, the
    output layer, with a shortlist); returns how many were wrapped."""
    wrapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if isinstance(child, torch.nn.Linear):
                setattr(parent, name,
                        DecodeLinear(child, SHORTLIST if child is output else 0))
                wrapped += 1
    return wrapped


@contextmanager
def decoding(model: torch.nn.Module) -> Iterator[None]:
    """One-token decode steps inside: linear layers with int8 copies use them."""
    layers = [m for m in model.modules() if isinstance(m, DecodeLinear)]
    for layer in layers:
        layer.decoding = True
    try:
        yield
    finally:
        for layer in layers:
            layer.decoding = False
