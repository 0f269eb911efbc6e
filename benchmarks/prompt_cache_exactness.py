"""Prompt Cache exactness on a real model: the checks tests/upstream/test_prompt_cache.py runs on
tiny random-init models in CI, here on the real Gemma 3 270M (or any --model), reporting
the largest logit (or key/value) difference of each against its uncached reference.

1. independent modules with a gap (the test schema) vs one pass with the block mask;
2. a decode step after that gap vs its reference;
3. a contiguous prefix (one module, no system prompt: modules do not see it) vs a plain
   full prefill, and the greedy text of both paths;
4. the test schema scaled to the window: a union member longer than twice the sliding
   window and a module placed after it, beyond the window; imported together, and with
   the short member instead (a gap wider than the window): logits vs the block-masked
   reference, and the long module's cached keys and values vs one pass with the
   window-cut mask.

The references reuse the test module's own functions, so CI and this benchmark check the
same thing. Built-in models are converted once into --cache-dir. Float32 on the CPU;
differences are compared with --tolerance (the tests' 1e-4 by default) and with the noise
floor of the model itself: the same full prefill computed with transformers' masks and
with our explicit per-layer-type mask.

    python benchmarks/prompt_cache_exactness.py                       # Gemma 3 270M
    python benchmarks/prompt_cache_exactness.py --model builtin:tiny-gemma3
"""

import sys

import torch
from _common import REPO_ROOT, base_parser, heading, make_table, note, print_command, print_table
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import Delta, PromptCacheEngine
from meancache.upstream.prompt_cache.layout import LEADING
from meancache.upstream.prompt_cache.states import attention_mask
from meancache.upstream.sampling import SamplingParams

sys.path[:0] = [str(REPO_ROOT / "tests" / "upstream"), str(REPO_ROOT)]  # and tests.support
from test_prompt_cache import (  # noqa: E402  (the checks' references live with the tests)
    PROMPT,
    SCHEMA,
    decode_step,
    prefill_logits,
    reference_logits,
    reference_mask,
    uncached_greedy,
)

FILLER = "The river runs under seven bridges before it reaches the sea. "


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max())


def independent_modules(engine: PromptCacheEngine) -> tuple[float, float]:
    prepared = engine.prepare_messages([{"role": "user", "content": PROMPT}])
    reference, _ = reference_logits(engine, prepared, 0.0)
    gaps = max_diff(prefill_logits(engine, prepared), reference)
    step, token = decode_step(engine, prepared)
    decode = max_diff(step, reference_logits(engine, prepared, 0.0, [token])[0][-1])
    return gaps, decode


def filler(engine: PromptCacheEngine, tokens: int) -> str:
    ids = engine.tokenizer.encode(FILLER * tokens, add_special_tokens=False)[:tokens]
    return str(engine.tokenizer.decode(ids))


def contiguous(engine: PromptCacheEngine, name: str, module: int
               ) -> tuple[float, bool, list[int]]:
    """One module of ``module`` tokens, imported, vs one plain pass over the same tokens."""
    engine.add_schema(f'<schema name="{name}">'
                      f'<module name="text">{filler(engine, module)}</module></schema>')
    prepared = engine.prepare_messages([{"role": "user", "content":
                                         f'<prompt schema="{name}"><text/>'
                                         "What runs under the bridges?</prompt>"}])
    layout = engine.layouts[name]
    full_ids = [t for _, key in prepared.cached for t in layout.segments[key].token_ids]
    if list(prepared.new_positions)[0] != len(full_ids):
        raise SystemExit(f"schema {name} does not lay its segments out contiguously")
    full_ids += list(prepared.new_ids)
    with torch.inference_mode():
        full = engine.model(input_ids=torch.tensor([full_ids])).logits[0]
    diff = max_diff(prefill_logits(engine, prepared), full[-len(prepared.new_ids):])
    params = SamplingParams(max_tokens=12, temperature=0.0)
    text = "".join(e.text for e in engine.generate(prepared, params) if isinstance(e, Delta))
    generated = uncached_greedy(engine, full_ids, params.max_tokens)
    reference = engine.tokenizer.decode(generated, skip_special_tokens=True)
    for stop in engine.loaded.stop:  # the engine ends an answer where the next turn starts
        reference = reference.split(stop)[0]
    same_text = text.strip() == reference.strip()
    return diff, same_text, full_ids


def scaled_schema(engine: PromptCacheEngine, window: int) -> tuple[float, float]:
    """``reference_logits`` reads the schema named "travel": this one replaces the test's."""
    engine.add_schema(
        '<schema name="travel"><system>You are a helpful travel assistant.</system><union>'
        '<module name="short">Plan a short trip of two days.</module>'
        f'<module name="long">{filler(engine, 2 * window + 100)}</module></union>'
        f'<module name="budget">{filler(engine, window + 50)}</module></schema>')
    diffs = []
    for member in ("long", "short"):
        prepared = engine.prepare_messages([{"role": "user", "content":
                                             f'<prompt schema="travel"><{member}/><budget/>'
                                             "<user>How much will it cost?</user></prompt>"}])
        diffs.append(max_diff(prefill_logits(engine, prepared),
                              reference_logits(engine, prepared, 0.0)[0]))
    return diffs[0], diffs[1]


def window_states(engine: PromptCacheEngine, name: str, module: str) -> float:
    """The module's cached keys/values vs one pass with the window-cut reference mask,
    relative to the largest reference value of each layer (values reach the hundreds)."""
    from transformers import DynamicCache

    layout = engine.layouts[name]
    leading, segment = layout.segments[LEADING], layout.segments[module]
    states = engine._states((name, module))
    positions = torch.tensor(leading.positions + segment.positions)
    causal = torch.ones(len(positions), len(positions), dtype=torch.bool).tril()
    cache = DynamicCache()
    with torch.inference_mode():
        engine.model(input_ids=torch.tensor([leading.token_ids + segment.token_ids]),
                     position_ids=positions[None], past_key_values=cache, use_cache=True,
                     attention_mask=reference_mask(engine.model, causal, positions))
    worst = 0.0
    for i, (keys, values) in enumerate(zip(states.keys, states.values, strict=True)):
        for ours, theirs in ((keys, cache.layers[i].keys), (values, cache.layers[i].values)):
            reference = theirs[:, :, len(leading):]
            worst = max(worst, max_diff(ours, reference) / float(reference.abs().max()))
    return worst


def noise_floor(engine: PromptCacheEngine, ids: list[int]) -> float:
    """The same plain prefill through transformers' masks and through ours."""
    positions = torch.arange(len(ids))
    causal = torch.ones(len(ids), len(ids), dtype=torch.bool).tril()
    with torch.inference_mode():
        own = engine.model(input_ids=torch.tensor([ids])).logits[0]
        ours = engine.model(input_ids=torch.tensor([ids]), position_ids=positions[None],
                            attention_mask=attention_mask(engine.model, causal, positions,
                                                          positions)).logits[0]
    return max_diff(own, ours)


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--model", default="builtin:gemma-3-270m")
    parser.add_argument("--tolerance", type=float, default=1e-4)
    args = parser.parse_args()
    loaded = load_model(args.model, device="cpu", data_dir=args.cache_dir)
    engine = PromptCacheEngine(loaded, kv_format="float32")  # exactness of reuse itself
    engine.add_schema(SCHEMA)
    window = getattr(engine.model.config, "sliding_window", None) or 256
    note(f"{args.model}: {engine.model.config.model_type}, sliding window {window}")

    gaps, decode = independent_modules(engine)
    short, short_text, short_ids = contiguous(engine, "short", 200)
    scaled = PromptCacheEngine(loaded, kv_format="float32")
    together, gap = scaled_schema(scaled, window)
    states = window_states(scaled, "travel", "long")
    floor = noise_floor(engine, short_ids)

    heading(f"Prompt Cache exactness on {args.model} (max |difference|, float32)")
    table = make_table(["check", "max |diff|", f"<= {args.tolerance:g}", "greedy text"])
    rows = [
        ("independent modules with a gap: logits", gaps, None),
        ("decode step after the gap: logits", decode, None),
        ("contiguous 200-token module: logits", short, short_text),
        (f"{2 * window + 100}-token module, then one beyond the {window}-token window: "
         "logits", together, None),
        (f"gap wider than the {window}-token window, then a module: logits", gap, None),
        (f"the {2 * window + 100}-token module's cached keys and values (relative)", states,
         None),
        ("noise floor: one prefill, transformers' masks vs ours", floor, None),
    ]
    for label, diff, text in rows:
        table.add_row(label, f"{diff:.2e}", "yes" if diff <= args.tolerance else "NO",
                      "-" if text is None else ("same" if text else "DIFFERS"))
    print_table(table)
    print_command()


if __name__ == "__main__":
    main()
