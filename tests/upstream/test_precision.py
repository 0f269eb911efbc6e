"""Serving precision ``fp16-int8``: float16 linear layers, an int8 output layer whose
shortlist is scored exactly, and a lossless bfloat16 embedding; Prompt Cache stays exact
within it."""

import pytest
import torch
from meancache.upstream.compact_weights import SHORTLIST, BFloat16Embedding, ShortlistOutput
from meancache.upstream.errors import ModelLoadError
from meancache.upstream.model_loading import load_model
from meancache.upstream.precision import apply_precision
from meancache.upstream.prompt_cache.engine import (
    Delta,
    Finish,
    PreparedPrompt,
    PromptCacheEngine,
)
from meancache.upstream.sampling import SamplingParams

# Compares the results of numeric kernels: CI runs these on AVX2 kernels too.
pytestmark = pytest.mark.kernels

DOC = ('<schema name="doc"><module name="text">A document about rivers and the bridges '
       "over them, and the towns between the bridges.</module></schema>")
ASK = '<prompt schema="doc"><text/>Summarise it.</prompt>'


def bfloat16_valued_gemma() -> torch.nn.Module:
    """tiny-gemma3 with every weight rounded to bfloat16, as weights converted from a
    bfloat16 or GGUF file are (the real Gemma 3 270M's are)."""
    model = load_model("builtin:tiny-gemma3", device="cpu").model
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(parameter.bfloat16().float())
    return model


def test_an_unknown_precision_is_refused_by_name() -> None:
    with pytest.raises(ModelLoadError, match="unknown precision 'int3'.*float32, fp16-int8, int4"):
        load_model("builtin:tiny-gemma3", device="cpu", precision="int3")


def test_the_shortlist_is_scored_exactly_and_the_rest_in_int8() -> None:
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 500, bias=False)
    x = torch.randn(1, 3, 48)
    output = ShortlistOutput(linear, linear.weight.detach())
    with torch.inference_mode():
        exact = linear(x)
        approx = output(x)
        # The int8 kernel called again on the same input gives the same logits, whatever
        # code path (AVX2, AVX-512, VNNI) this CPU takes: they name the shortlist.
        int8 = output.int8_logits(x)
    shortlist = int8.topk(SHORTLIST, dim=-1).indices
    on_list = torch.zeros_like(approx, dtype=torch.bool).scatter_(-1, shortlist, True)
    # The shortlist in float32: two kernels summing 48 products in different orders differ
    # by at most 48 * float32 eps * sum |x_k w_k| (the standard dot-product error bound).
    fp32_bound = 48 * torch.finfo(torch.float32).eps * (x.abs() @ linear.weight.abs().T)
    assert ((approx - exact).abs() <= fp32_bound)[on_list].all()
    # The rest is int8's: weights rounded per word (their dequantised values are known),
    # activations rounded to one per-tensor step s_x = range / 255 (range / 127 where the
    # CPU's kernel needs 7 bits), so |error| <= |x| . |w - w_q| + s_x / 2 * sum |w_q|, up to
    # float32 rounding.
    assert torch.equal(approx[~on_list], int8[~on_list])
    weights = output.int8.unpack()[0].dequantize().float()
    step = (x.max().clamp(min=0) - x.min().clamp(max=0)) / (127 if output.reduce_range else 255)
    int8_bound = (x.abs() @ (linear.weight - weights).abs().T
                  + step / 2 * weights.abs().sum(1)) * (1 + 1e-5)
    error = (approx - exact).abs()
    assert (error <= int8_bound)[~on_list].all()
    assert error[~on_list].max() > 0  # int8 arithmetic ran for the rest of the vocabulary
    assert torch.equal(approx.argmax(-1), exact.argmax(-1))


def test_a_bfloat16_valued_embedding_is_kept_in_bfloat16_and_reads_back_exactly() -> None:
    reference = bfloat16_valued_gemma()
    model = bfloat16_valued_gemma()
    apply_precision(model, "fp16-int8")  # compacted in place
    embedding = model.get_input_embeddings()
    assert isinstance(embedding, BFloat16Embedding) and embedding.table.dtype == torch.bfloat16
    assert isinstance(model.get_output_embeddings(), ShortlistOutput)
    assert not any(isinstance(m, torch.nn.Linear) for m in model.modules())  # all float16
    ids = torch.tensor([[5, 17, 99, 3]])
    with torch.inference_mode():
        assert torch.equal(embedding(ids), reference.get_input_embeddings()(ids))
        ours, theirs = model(input_ids=ids).logits[0], reference(input_ids=ids).logits[0]
    assert torch.equal(ours.argmax(-1), theirs.argmax(-1))
    assert torch.nn.functional.cosine_similarity(ours, theirs, dim=-1).min() > 0.999


def test_an_embedding_that_is_not_bfloat16_valued_stays_float32() -> None:
    loaded = load_model("builtin:tiny-gemma3", device="cpu", precision="fp16-int8")
    assert loaded.parameters == load_model("builtin:tiny-gemma3", device="cpu").parameters
    model = loaded.model
    assert not isinstance(model.get_input_embeddings(), BFloat16Embedding)
    assert model.get_input_embeddings().weight.dtype == torch.float32
    assert isinstance(model.get_output_embeddings(), ShortlistOutput)


def test_answers_equal_with_and_without_reused_modules_in_fp16_int8() -> None:
    """Prompt Cache stays exact within the served precision: the module reused from the
    cache and the same tokens read as one plain prompt give the same answer."""
    engine = PromptCacheEngine(load_model("builtin:tiny-gemma3", device="cpu",
                                          precision="fp16-int8"))
    engine.add_schema(DOC)
    cached = engine.prepare_messages([{"role": "user", "content": ASK}])
    assert cached.cached
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
    logits_cached, _, _ = engine.prefill(cached)
    logits_plain, _, _ = engine.prefill(plain)
    # Each position's best word is on the shortlist, scored in float32 from hidden states
    # that the two paths sum in different orders (relative error ~ float32 eps x reduction
    # length, far below 1e-4 of these logits). The other words' int8 logits may move by a
    # whole activation step where a hidden value crosses a rounding boundary: not compared.
    assert torch.equal(logits_cached.argmax(-1), logits_plain.argmax(-1))
    best_cached, best_plain = logits_cached.max(-1).values, logits_plain.max(-1).values
    assert ((best_cached - best_plain).abs() <= 1e-4 * best_plain.abs().clamp(min=1)).all()
