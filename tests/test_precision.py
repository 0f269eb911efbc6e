"""Serving precision: int8 quantises only the output layer, so the transformer layers (and
the module states Prompt Cache reuses) are exactly the float32 ones."""

import pytest
import torch
from meancache.upstream.errors import ModelLoadError
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import Delta, Finish, PromptCacheEngine
from meancache.upstream.sampling import SamplingParams


def test_an_unknown_precision_is_refused_by_name() -> None:
    with pytest.raises(ModelLoadError, match="unknown precision 'int4'.*float32, int8"):
        load_model("builtin:tiny-gemma3", device="cpu", precision="int4")


def test_int8_quantises_the_output_layer_only() -> None:
    full = load_model("builtin:tiny-gemma3", device="cpu").model
    int8 = load_model("builtin:tiny-gemma3", device="cpu", precision="int8").model
    assert isinstance(full.get_output_embeddings(), torch.nn.Linear)
    output = int8.get_output_embeddings()
    assert not isinstance(output, torch.nn.Linear)
    assert "quantized" in type(output).__module__
    ours, theirs = dict(int8.named_parameters()), dict(full.named_parameters())
    assert ours.keys() <= theirs.keys() and len(ours) > 10
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)


def test_an_int8_model_reuses_modules_and_answers() -> None:
    engine = PromptCacheEngine(load_model("builtin:tiny-gemma3", device="cpu",
                                          precision="int8"))
    engine.add_schema('<schema name="doc"><module name="text">A document about rivers and '
                      "the bridges over them.</module></schema>")
    prepared = engine.prepare_messages(
        [{"role": "user", "content": '<prompt schema="doc"><text/>Summarise it.</prompt>'}])
    events = list(engine.generate(prepared, SamplingParams(max_tokens=5, temperature=0.0)))
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert finish.cached_tokens > 0 and finish.completion_tokens > 0
    assert any(isinstance(e, Delta) for e in events)
