"""Serving precision: ``int8`` runs one-token decode steps on int8 copies of the weights,
while prompts and the module states Prompt Cache reuses stay exactly float32's."""

import pytest
import torch
from meancache.upstream.errors import ModelLoadError
from meancache.upstream.int8_decode import DecodeLinear, decoding
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import (
    Delta,
    Finish,
    PreparedPrompt,
    PromptCacheEngine,
)
from meancache.upstream.sampling import SamplingParams

DOC = ('<schema name="doc"><module name="text">A document about rivers and the bridges '
       "over them, and the towns between the bridges.</module></schema>")
ASK = '<prompt schema="doc"><text/>Summarise it.</prompt>'


def engines() -> tuple[PromptCacheEngine, PromptCacheEngine]:
    full = PromptCacheEngine(load_model("builtin:tiny-gemma3", device="cpu"))
    int8 = PromptCacheEngine(load_model("builtin:tiny-gemma3", device="cpu", precision="int8"))
    for engine in (full, int8):
        engine.add_schema(DOC)
    return full, int8


def test_an_unknown_precision_is_refused_by_name() -> None:
    with pytest.raises(ModelLoadError, match="unknown precision 'int4'.*float32, int8"):
        load_model("builtin:tiny-gemma3", device="cpu", precision="int4")


def test_the_shortlist_is_scored_in_float32_and_the_rest_in_int8() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 500, bias=False)
    layer = DecodeLinear(linear, shortlist=16)
    x = torch.randn(1, 1, 48)
    with torch.inference_mode():
        exact = linear(x)
        assert torch.equal(layer(x), exact)  # outside decoding: the float32 weights
        with decoding(layer):
            approx = layer(x)
        assert not layer.decoding
    best = approx.topk(16, dim=-1).indices
    assert torch.allclose(approx.gather(-1, best), exact.gather(-1, best), atol=1e-5)
    rest = torch.ones_like(approx, dtype=torch.bool).scatter_(-1, best, False)
    error = (approx - exact)[rest].abs()
    assert error.max() > 0  # int8 arithmetic ran for the rest of the vocabulary
    assert error.max() < 0.05 * exact.abs().max()
    assert int(approx.argmax()) == int(exact.argmax())


def test_prompts_and_module_states_stay_float32_and_decode_steps_use_int8() -> None:
    full, int8 = engines()
    assert isinstance(int8.model.get_output_embeddings(), DecodeLinear)
    prepared = full.prepare_messages([{"role": "user", "content": ASK}])
    assert prepared.cached  # the module is reused
    logits_full, seen, cache_full = full.prefill(prepared)
    logits_int8, _, cache_int8 = int8.prefill(prepared)
    assert torch.equal(logits_full, logits_int8)
    for ours, theirs in zip(cache_int8.layers, cache_full.layers, strict=True):
        assert torch.equal(ours.keys, theirs.keys) and torch.equal(ours.values, theirs.values)
    token = int(logits_full.argmax())
    last = max(prepared.new_positions) + 1
    step_full, _ = full.decode_step(token, last, seen, cache_full)
    step_int8, _ = int8.decode_step(token, last, seen, cache_int8)
    assert not torch.equal(step_full, step_int8)  # the step ran on int8 weights
    assert torch.nn.functional.cosine_similarity(step_full, step_int8, dim=0) > 0.99


def test_int8_answers_equal_with_and_without_reused_modules() -> None:
    """Prompt Cache stays exact on the served precision: the module reused from the cache
    and the same tokens read as one plain prompt give the same int8 answer."""
    _, engine = engines()
    cached = engine.prepare_messages([{"role": "user", "content": ASK}])
    ids = [token for schema, segment in cached.cached
           for token in engine.layouts[schema].segments[segment].token_ids]
    ids += cached.new_ids
    assert list(cached.new_positions)[0] == len(ids) - len(cached.new_ids)
    plain = PreparedPrompt((), tuple(ids), tuple(range(len(ids))))
    params = SamplingParams(max_tokens=12, temperature=0.0)
    answers = []
    for prepared in (cached, plain):
        events = list(engine.generate(prepared, params))
        assert isinstance(events[-1], Finish) and events[-1].completion_tokens > 1
        answers.append("".join(e.text for e in events if isinstance(e, Delta)))
    assert answers[0] == answers[1]
