"""References for exactness tests in any KV format (upstream.kv_rounding).

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
from meancache.upstream.prompt_cache.engine import PreparedPrompt, PromptCacheEngine
from meancache.upstream.prompt_cache.layout import LEADING
from meancache.upstream.prompt_cache.states import additive_mask


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


def reference_mask(model: torch.nn.Module, allowed: torch.Tensor, positions: torch.Tensor
                   ) -> torch.Tensor | dict[str, torch.Tensor]:
    """What each layer type may see: ``allowed``, and for sliding layers only keys less than
    ``sliding_window`` positions behind the query (transformers' own window rule)."""
    full = additive_mask(allowed, model.dtype)
    if "sliding_attention" not in (getattr(model.config, "layer_types", None) or ()):
        return full
    near = positions[:, None] - positions[None, :] < model.config.sliding_window
    return {"full_attention": full, "sliding_attention": additive_mask(allowed & near, model.dtype)}


def reference_logits(engine: PromptCacheEngine, prepared: PreparedPrompt, tolerance: float,
                     extra: list[int] = ()  # type: ignore[assignment]
                     ) -> tuple[torch.Tensor, float]:
    """One uncached forward pass with the equivalent block mask; logits of the new tokens
    (and of ``extra`` tokens decoded after them), and the bound a cached path meets."""
    layout = engine.layouts[prepared.cached[0][0]]  # a prompt reads one schema's segments
    ids: list[int] = []
    positions: list[int] = []
    block: list[str] = []
    for _, key in prepared.cached:
        segment = layout.segments[key]
        ids += segment.token_ids
        positions += segment.positions
        block += [key] * len(segment)
    n_cached = len(ids)
    ids += list(prepared.new_ids)
    positions += list(prepared.new_positions)
    last = max(prepared.new_positions)
    for offset, token in enumerate(extra, 1):
        ids.append(token)
        positions.append(last + offset)
    n = len(ids)
    pos = torch.tensor(positions)
    allowed = torch.zeros(n, n, dtype=torch.bool)
    for q in range(n_cached):  # a segment sees the leading tokens and its own earlier ones
        for k in range(n_cached):
            same = block[k] == block[q] and k <= q
            allowed[q, k] = same or (block[k] == LEADING and block[q] != LEADING)
    allowed[n_cached:, :n_cached] = pos[:n_cached][None, :] < pos[n_cached:][:, None]
    allowed[n_cached:, n_cached:] = pos[None, n_cached:] <= pos[n_cached:, None]
    logits, bound = rounded_reference(engine, tolerance, input_ids=torch.tensor([ids]),
                                      position_ids=pos[None],
                                      attention_mask=reference_mask(engine.model, allowed, pos))
    return logits[n_cached:], bound
