"""Prompt Cache exactness: reused module states give the logits a full forward pass gives.

References are computed without any cached states: one forward pass over every token at
its position, with the block attention mask that independent module encoding implies (and,
for Gemma 3's sliding layers, that mask cut to the window, measured in positions), its
keys and values rounded to the engine's KV format as the engine rounds them
(tests.support.kv_reference gives the bound for each format).
"""

from pathlib import Path

import pytest
import torch
from meancache.upstream.builtin import builtin_tokenizer
from meancache.upstream.model_loading import LoadedModel, load_model
from meancache.upstream.prompt_cache.engine import Delta, Finish, PreparedPrompt, PromptCacheEngine
from meancache.upstream.prompt_cache.layout import LEADING
from meancache.upstream.prompt_cache.states import additive_mask, attention_mask, concatenate
from meancache.upstream.sampling import SamplingParams, TextStream

from tests.support.kv_reference import (
    error_bound,
    reference_logits,
    reference_mask,
    rounded_reference,
)

# Compares the results of numeric kernels: CI runs these on AVX2 kernels too.
pytestmark = pytest.mark.kernels

# Cached and uncached paths differ only in float32 summation order: worst case about
# float32 eps (1.2e-7) x the longest reduction (hidden 64-128, attention over < 200
# positions) x the size of the values (logits and states of these tiny models stay below
# ~5), i.e. ~1e-4; measured differences are ~1e-7. Token choices are compared exactly.
TOLERANCE = 1e-4

SCHEMA = """<schema name="travel">
  <system>You are a helpful travel assistant.</system>
  <module name="city">Facts about <param name="name" len="12"/>, a city worth seeing.
    <module name="history">It was founded long ago and grew along a river.</module>
  </module>
  <union>
    <module name="short">Plan a short trip of two days.</module>
    <module name="long">Plan a long trip of two weeks, with many museums and parks.</module>
  </union>
  <module name="budget">Keep the budget small.</module>
</schema>"""

PROMPT = """<prompt schema="travel"><city name="Lyon"><history/></city><long/>
  <user>What should I see first?</user></prompt>"""


def saved_model_dir(architecture: str, directory: Path) -> Path:
    """A random-init model of another Llama-family architecture, saved as a local directory
    (what a user's downloaded model looks like), with the built-in tokenizer."""
    from meancache.upstream.builtin import VOCAB_SIZE, builtin_tokenizer
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    config_class, model_class = {"mistral": (MistralConfig, MistralForCausalLM),
                                 "qwen2": (Qwen2Config, Qwen2ForCausalLM)}[architecture]
    torch.manual_seed(0)
    config = config_class(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128,
                          num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                          max_position_embeddings=4096, bos_token_id=256, eos_token_id=257)
    model_class(config).save_pretrained(directory)
    builtin_tokenizer().save_pretrained(directory)
    return directory


@pytest.fixture(scope="module",
                params=["builtin:tiny", "builtin:tiny-gpt2", "builtin:tiny-gemma3", "dir:mistral",
                        "dir:qwen2", "builtin:tiny-gemma3 float32", "builtin:tiny-gemma3 bfloat16",
                        "builtin:tiny-gemma3 int8", "builtin:tiny-gpt2 int8"])
def engine(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
           ) -> PromptCacheEngine:
    """Every architecture in the default KV format, and the other formats on two."""
    spec, _, kv_format = request.param.partition(" ")
    if spec.startswith("dir:"):
        architecture = spec.removeprefix("dir:")
        spec = str(saved_model_dir(architecture, tmp_path_factory.mktemp(architecture)))
    engine = PromptCacheEngine(load_model(spec, device="cpu"),
                               **({"kv_format": kv_format} if kv_format else {}))
    engine.add_schema(SCHEMA)
    return engine


def prefill_logits(engine: PromptCacheEngine, prepared: PreparedPrompt) -> torch.Tensor:
    """All new tokens' logits from the cached path (the engine keeps only the last)."""
    states = [engine._states(key) for key in prepared.cached]
    cache, cached_positions = concatenate(states, engine.kv_format)
    positions = torch.tensor(prepared.new_positions)
    allowed = torch.cat([cached_positions[None, :] < positions[:, None],
                         positions[None, :] <= positions[:, None]], dim=1)
    seen = torch.cat([cached_positions, positions])
    with torch.inference_mode():
        out = engine.model(input_ids=torch.tensor([prepared.new_ids]),
                           position_ids=positions[None],
                           attention_mask=attention_mask(engine.model, allowed, positions, seen),
                           past_key_values=cache, use_cache=True)
    return out.logits[0]


def uncached_greedy(engine: PromptCacheEngine, ids: list[int], max_tokens: int) -> list[int]:
    """Greedy tokens after ``ids`` from plain full forward passes, with no cached states
    (each pass rounds its states to the engine's KV format)."""
    ids, generated = list(ids), []
    with torch.inference_mode():
        for _ in range(max_tokens):
            token = int(engine.model(input_ids=torch.tensor([ids]), use_cache=True,
                                     past_key_values=engine.new_cache()).logits[0, -1].argmax())
            if token in engine._eos:
                break
            generated.append(token)
            ids.append(token)
    return generated


def test_layout_gives_unions_a_shared_start_and_params_reserved_positions(
    engine: PromptCacheEngine,
) -> None:
    layout = engine.layouts["travel"]
    short, long = layout.segments["short"], layout.segments["long"]
    assert short.positions[0] == long.positions[0]
    budget = layout.segments["budget"]
    assert budget.positions[0] == long.positions[-1] + 1  # the union takes its longest member
    slot = layout.params[("city", "name")]
    city = layout.segments["city"].positions
    assert slot.start not in city and slot.start + slot.length - 1 not in city
    assert slot.start + slot.length in city  # the module's text resumes after the slot


def test_gaps_and_independent_modules_equal_the_block_masked_reference(
    engine: PromptCacheEngine,
) -> None:
    prepared = engine.prepare_messages([{"role": "user", "content": PROMPT}])
    keys = [key for _, key in prepared.cached]
    assert keys == [LEADING, "", "city", "history", "long"]  # short and budget left out
    assert len(prepared.new_positions) > len("Lyon")
    cached = prefill_logits(engine, prepared)
    reference, bound = reference_logits(engine, prepared, TOLERANCE)
    assert (cached - reference).abs().max().item() <= bound
    logits, _, _ = engine.prefill(prepared)
    assert (logits - reference[-1]).abs().max().item() <= bound


def decode_step(engine: PromptCacheEngine, prepared: PreparedPrompt
                ) -> tuple[torch.Tensor, int]:
    """The cached path's logits one greedy token after the prompt, and that token."""
    logits, seen, cache = engine.prefill(prepared)
    token = int(logits.argmax())
    step, _ = engine.decode_step(token, max(prepared.new_positions) + 1, seen, cache)
    return step, token


def test_a_decode_step_after_a_gap_equals_its_reference(engine: PromptCacheEngine) -> None:
    prepared = engine.prepare_messages([{"role": "user", "content": PROMPT}])
    step, token = decode_step(engine, prepared)
    reference, bound = reference_logits(engine, prepared, TOLERANCE, [token])
    assert (step - reference[-1]).abs().max().item() <= bound


def test_a_contiguous_prefix_equals_a_full_prefill_and_greedy_text_matches(
    engine: PromptCacheEngine,
) -> None:
    engine.add_schema('<schema name="doc"><module name="text">'
                      + "A document about rivers, bridges and the towns between them. " * 4
                      + "</module></schema>")
    prepared = engine.prepare_messages(
        [{"role": "user", "content": '<prompt schema="doc"><text/>Summarise it.</prompt>'}]
    )
    layout = engine.layouts["doc"]
    full_ids = layout.segments[LEADING].token_ids + layout.segments["text"].token_ids
    full_ids += list(prepared.new_ids)
    assert list(prepared.new_positions)[0] == len(full_ids) - len(prepared.new_ids)
    assert engine.prompt_ids(prepared) == full_ids  # what the repetition guard reads

    # plain causal prefill: no cached states, no mask, default positions
    full, bound = rounded_reference(engine, TOLERANCE, input_ids=torch.tensor([full_ids]))
    cached = prefill_logits(engine, prepared)
    assert (cached - full[-len(prepared.new_ids):]).abs().max().item() <= bound

    params = SamplingParams(max_tokens=12, temperature=0.0)
    events = list(engine.generate(prepared, params))
    text = "".join(e.text for e in events if isinstance(e, Delta))
    generated = uncached_greedy(engine, full_ids, params.max_tokens)
    assert text == engine.tokenizer.decode(generated, skip_special_tokens=True)
    finish = events[-1]
    assert isinstance(finish, Finish)
    assert finish.cached_tokens == len(full_ids) - len(prepared.new_ids)
    assert finish.prompt_tokens == len(full_ids)


def test_serving_does_not_mutate_module_states(engine: PromptCacheEngine) -> None:
    """DynamicCache grows in place during a forward pass; modules must not. The prompt is
    read once first, so that both prefills compared take the same path (prefix blocks read
    back): a full pass and a read-back one agree only within the KV format's bound, and
    Gemma 3's sliding layers then attend over fewer keys, summed in another order."""
    prepared = engine.prepare_messages([{"role": "user", "content": PROMPT}])
    engine.prefill(prepared)
    before = {key: engine._states(key).keys[0].clone() for key in prepared.cached}
    first, _, _ = engine.prefill(prepared)
    list(engine.generate(prepared, SamplingParams(max_tokens=5, temperature=0.0)))
    second, _, _ = engine.prefill(prepared)
    assert torch.equal(first, second)
    for key, keys in before.items():
        assert torch.equal(engine._states(key).keys[0], keys)


def test_position_jumps_need_the_explicit_mask(engine: PromptCacheEngine) -> None:
    """Without a cache or a 4D mask, transformers 5.x reads a jump in position_ids as
    packed sequences and cuts attention at the jump: the reason every pass here has a mask."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    positions = torch.tensor([[0, 1, 2, 10, 11, 12]])
    causal = torch.ones(6, 6, dtype=torch.bool).tril()
    with torch.inference_mode():
        masked = engine.model(input_ids=ids, position_ids=positions,
                              attention_mask=additive_mask(causal, engine.model.dtype)).logits
        naive = engine.model(input_ids=ids, position_ids=positions, use_cache=False).logits
        alone = engine.model(input_ids=ids[:, 3:], position_ids=positions[:, 3:] - 10,
                             use_cache=False).logits
    assert (masked[0, 3:] - naive[0, 3:]).abs().max().item() > 1e-3
    if engine.loaded.architecture == "llama":  # rotary: relative positions only
        assert (naive[0, 3:] - alone[0]).abs().max().item() <= TOLERANCE


def test_memory_per_token_matches_the_formula(engine: PromptCacheEngine) -> None:
    """2 (K, V) x layers x kv heads x one head's row: head_dim x 4 bytes in float32, x 2
    in float16 and bfloat16, head_dim int8 codes + a 4-byte float32 scale in int8."""
    config = engine.model.config
    layers = getattr(config, "num_hidden_layers", None) or config.n_layer
    heads = getattr(config, "num_attention_heads", None) or config.n_head
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    hidden = getattr(config, "hidden_size", None) or config.n_embd
    head_dim = hidden // heads
    row = {"float32": 4 * head_dim, "float16": 2 * head_dim, "bfloat16": 2 * head_dim,
           "int8": head_dim + 4}[engine.kv_format.name]
    expected = 2 * layers * kv_heads * row
    states = engine._states(("travel", "city"))
    assert states.nbytes == expected * states.tokens
    assert engine.bytes_per_token == expected


def test_evicted_modules_are_encoded_again_with_the_same_result() -> None:
    engine = PromptCacheEngine(load_model("builtin:tiny", device="cpu"),
                               module_budget_bytes=1)
    engine.add_schema(SCHEMA)
    prepared = engine.prepare_messages([{"role": "user", "content": PROMPT}])
    other = engine.prepare_messages([{"role": "user", "content":
                                      '<prompt schema="travel"><short/><budget/>Go</prompt>'}])
    assert engine.modules.evictions > 0
    first, _, _ = engine.prefill(prepared)
    engine.prefill(other)  # its modules push out the first prompt's
    assert ("travel", "long") not in engine.modules
    encodings = engine.modules.encodings
    second, _, _ = engine.prefill(prepared)
    assert engine.modules.encodings > encodings
    assert torch.equal(first, second)


def test_prompt_too_long_is_refused(engine: PromptCacheEngine) -> None:
    from meancache.upstream.errors import PromptTooLongError

    prepared = engine.prepare_messages([{"role": "user", "content": "hi"}])
    with pytest.raises(PromptTooLongError, match="context holds"):
        list(engine.generate(prepared, SamplingParams(
            max_tokens=engine.loaded.context_length)))


def test_builtin_models_are_reported_untrained_and_local_ones_not(
    engine: PromptCacheEngine,
) -> None:
    loaded: LoadedModel = engine.loaded
    assert loaded.untrained == loaded.name.startswith("builtin:")
    assert loaded.architecture in {"llama", "gpt2", "gemma3_text", "mistral", "qwen2"}


def test_other_architectures_are_refused_with_a_clear_message(tmp_path: Path) -> None:
    from meancache.upstream.errors import ModelLoadError, UnsupportedModelError
    from transformers import BertConfig

    BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
               num_attention_heads=2, intermediate_size=64).save_pretrained(tmp_path)
    with pytest.raises(UnsupportedModelError, match="'bert' model; Prompt Cache supports"):
        load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="never downloads"):
        load_model("meta-llama/Llama-3-8B")
    with pytest.raises(ModelLoadError, match="builtin:tiny"):
        load_model("builtin:huge")


@pytest.fixture(scope="module")
def gemma() -> PromptCacheEngine:
    engine = PromptCacheEngine(load_model("builtin:tiny-gemma3", device="cpu"))
    engine.add_schema(SCHEMA)
    return engine


def test_gemma3_sliding_layers_get_their_own_mask(gemma: PromptCacheEngine) -> None:
    """transformers applies a single 4D mask to every layer, sliding ones included: past the
    window it differs from the model's own masks, the per-layer-type dict does not."""
    model = gemma.model
    window = model.config.sliding_window
    positions = torch.arange(3 * window)
    ids = positions[None] + 1
    causal = torch.ones(len(positions), len(positions), dtype=torch.bool).tril()
    with torch.inference_mode():
        own = model(input_ids=ids).logits[0]  # transformers builds both masks itself
        ours = model(input_ids=ids, position_ids=positions[None],
                     attention_mask=attention_mask(model, causal, positions, positions)).logits[0]
        single = model(input_ids=ids, position_ids=positions[None],
                       attention_mask=additive_mask(causal, model.dtype)).logits[0]
    assert (ours - own).abs().max().item() <= TOLERANCE
    assert (single[:window] - own[:window]).abs().max().item() <= TOLERANCE
    assert (single[window:] - own[window:]).abs().max().item() > 1e-3


def test_gemma3_module_states_stay_exact_across_and_beyond_the_window(
    gemma: PromptCacheEngine,
) -> None:
    """A module longer than the window, placed beyond it: its cached keys and values equal
    those of one pass over the leading tokens and the module at their positions (rounded
    alike; a value that summation order moved across a rounding boundary is one step of
    the format, twice its rounding error, away)."""
    model = gemma.model
    window = model.config.sliding_window
    layout = gemma.layouts["travel"]
    leading, module = layout.segments[LEADING], layout.segments["long"]
    assert module.positions[0] - leading.positions[-1] > window
    assert len(module) > 2 * window
    states = gemma._states(("travel", "long"))
    positions = torch.tensor(leading.positions + module.positions)
    causal = torch.ones(len(positions), len(positions), dtype=torch.bool).tril()
    cache = gemma.new_cache()
    with torch.inference_mode():
        model(input_ids=torch.tensor([leading.token_ids + module.token_ids]),
              position_ids=positions[None], past_key_values=cache, use_cache=True,
              attention_mask=reference_mask(model, causal, positions))
    ours, _ = concatenate([states], gemma.kv_format)
    for mine, whole in zip(ours.layers, cache.layers, strict=True):
        for kept, full in ((mine.keys, whole.keys), (mine.values, whole.values)):
            full = full[:, :, len(leading):]
            bound = TOLERANCE + 2 * error_bound(gemma.kv_format.name, full)
            assert ((kept - full).abs() <= bound).all()


def test_an_answer_starts_at_its_first_visible_character() -> None:
    """A base model continues "Answer:" with " Paris"; the stop string still ends it."""
    tokenizer = builtin_tokenizer()
    stream = TextStream(tokenizer, ("\nQuestion:",))
    ids = tokenizer.encode(" \n Paris.\nQuestion: and Spain?", add_special_tokens=False)
    text = "".join(stream.push(token) for token in ids) + stream.flush()
    assert text == "Paris."
    assert stream.stopped
