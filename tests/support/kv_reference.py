"""References for exactness tests in any KV format (upstream.prompt_cache.kv_format).

The engine rounds keys and values to its format as the model computes them, so a cached
path and a full prefill round the same float32 values, and differ by float32 summation
order (``tolerance``: float32 eps x reduction length x value size, as the tests say).
Where two such values straddle a rounding boundary of the format, they land one step of
it apart (a step is twice the largest rounding error); to first order such an element
moves the logits at most as far as rounding every element by up to a step, which is
twice how far the format's own rounding (up to half a step) moves them. So the bound is
``tolerance + 2 x D``, D measured on the same pass: the logits with rounded states
against the logits with float32 states. For float32, D is 0 and the bound is unchanged.
"""

import torch
from meancache.upstream.prompt_cache.engine import PromptCacheEngine


def rounded_reference(engine: PromptCacheEngine, tolerance: float, **forward: object
                      ) -> tuple[torch.Tensor, float]:
    """Logits (of every position) of one uncached forward pass whose states are rounded to
    the engine's KV format, and the bound a cached path's logits meet against them."""
    with torch.inference_mode():
        rounded = engine.model(**forward, past_key_values=engine.new_cache(),
                               use_cache=True).logits[0]
        if engine.kv_format.name == "float32":
            return rounded, tolerance
        exact = engine.model(**forward).logits[0]
    return rounded, tolerance + 2 * (rounded - exact).abs().max().item()


def error_bound(kv_format: str, x: torch.Tensor) -> torch.Tensor:
    """Per element, how far the format's rounding may move float32 ``x``, from its
    definition: round to nearest with 11 (float16) or 8 (bfloat16) significant bits is
    within 2^-11 or 2^-8 of the value relative (float16 below its normal range, 2^-14:
    half its spacing 2^-24, absolute), int8 codes times the row's scale within half the
    scale; float32 arithmetic in the int8 path adds up to 2 float32 roundings (eps |x|)."""
    if kv_format == "float32":
        return torch.zeros_like(x)
    if kv_format == "float16":
        return torch.maximum(x.abs() * 2.0**-11, torch.full_like(x, 2.0**-25))
    if kv_format == "bfloat16":
        return torch.maximum(x.abs() * 2.0**-8, torch.full_like(x, 2.0**-134))
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    return scale / 2 + x.abs() * 2 * torch.finfo(torch.float32).eps
