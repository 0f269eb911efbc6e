"""Sliding-window layers handed only the states within their reach: a request reading a
module far longer than the window gets a full prefill's logits and greedy tokens.

The model is a random-init Gemma 3 with Gemma 3 270M's layer pattern (five sliding layers
to one full) and a window of 8, so a module of a few hundred tokens lies mostly out of the
sliding layers' reach. References are plain forward passes over every token from position
0 with no mask: the model builds its own masks (its window included), so they share no
code with the trimming. Both paths round K/V to the engine's format as computed, so they
differ by float32 summation order, plus, where that moves a value across a rounding
boundary of the format, one step of it (tests.support.kv_reference gives the bound).
"""


import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from meancache.upstream.builtin import VOCAB_SIZE, builtin_tokenizer
from meancache.upstream.model_loading import LoadedModel, load_model
from meancache.upstream.precision import KV_FORMATS
from meancache.upstream.prompt_cache.engine import Delta, PromptCacheEngine
from meancache.upstream.prompt_cache.layout import LEADING
from meancache.upstream.prompt_cache.states import out_of_window
from meancache.upstream.sampling import SamplingParams
from transformers import Gemma3ForCausalLM, Gemma3TextConfig

from tests.support.kv_reference import rounded_reference

pytestmark = pytest.mark.kernels  # compares numeric kernels' results, as test_prompt_cache

# float32 eps (1.2e-7) x the longest reduction (hidden 64, attention over < 400 positions)
# x the size of the values (below ~5 in this tiny model): ~1e-4, as in test_prompt_cache.
TOLERANCE = 1e-4
WINDOW = 8
LAYERS = 6  # Gemma 3's pattern: five sliding layers, then one full
DOCUMENT = "Rivers run under bridges and past the towns between them. " * 6
QUESTION = "Which river is it?"
GREEDY = SamplingParams(max_tokens=12, temperature=0.0)


@pytest.fixture(scope="module")
def loaded(tmp_path_factory: pytest.TempPathFactory) -> LoadedModel:
    """The tiny Gemma 3, saved as a local model directory and loaded as users' models are."""
    directory = tmp_path_factory.mktemp("gemma3-window8")
    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=VOCAB_SIZE, hidden_size=64, num_hidden_layers=LAYERS,
        num_attention_heads=4, num_key_value_heads=1, head_dim=16, query_pre_attn_scalar=16,
        intermediate_size=128, max_position_embeddings=4096, sliding_window=WINDOW,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        bos_token_id=256, eos_token_id=257, pad_token_id=261)
    Gemma3ForCausalLM(config).save_pretrained(directory)
    builtin_tokenizer().save_pretrained(directory)
    return load_model(str(directory), device="cpu")


@pytest.fixture(params=KV_FORMATS)
def engine(request: pytest.FixtureRequest, loaded: LoadedModel) -> PromptCacheEngine:
    """A new engine per test: one test's prefix blocks would let another's prefill start
    later than it asserts (its first query position decides what the window leaves out)."""
    engine = PromptCacheEngine(loaded, kv_format=request.param)
    engine.add_schema(f'<schema name="doc"><module name="text">{DOCUMENT}</module></schema>')
    return engine


def greedy_from_scratch(engine: PromptCacheEngine, ids: list[int], max_tokens: int
                        ) -> list[int]:
    """Greedy tokens after ``ids``, each from a plain forward pass over every token (its
    states rounded to the engine's KV format), no state reused."""
    ids, generated = list(ids), []
    for _ in range(max_tokens):
        logits, _ = rounded_reference(engine, TOLERANCE, input_ids=torch.tensor([ids]))
        token = int(logits[-1].argmax())
        if token in engine._eos:
            break
        generated.append(token)
        ids.append(token)
    return generated


def test_a_module_longer_than_the_window_gives_a_full_prefills_logits_and_tokens(
    engine: PromptCacheEngine,
) -> None:
    prepared = engine.prepare_pml_source(f'<prompt schema="doc"><text/>{QUESTION}</prompt>')
    layout = engine.layouts["doc"]
    full_ids = (layout.segments[LEADING].token_ids + layout.segments["text"].token_ids
                + list(prepared.new_ids))
    module = len(layout.segments["text"])
    assert module > 20 * WINDOW

    logits, seen, cache = engine.prefill(prepared)
    # the sliding layers were handed only the window's last states; the full ones, all
    first = min(prepared.new_positions)
    assert cache.sliding_skip == int((seen[:-len(prepared.new_ids)] <= first - WINDOW).sum())
    for index, layer in enumerate(cache.layers):
        held = layer.keys.shape[2]
        sliding = engine.sliding[index]
        assert held == (WINDOW - 1 if sliding else len(full_ids) - len(prepared.new_ids)) \
            + len(prepared.new_ids)
        assert cache.held_from(index) == (cache.sliding_skip if sliding else 0)

    reference, bound = rounded_reference(engine, TOLERANCE, input_ids=torch.tensor([full_ids]))
    assert (logits - reference[-1]).abs().max().item() <= bound
    token = int(logits.argmax())
    step, _ = engine.decode_step(token, len(full_ids), seen, cache)
    after, bound = rounded_reference(engine, TOLERANCE,
                                     input_ids=torch.tensor([[*full_ids, token]]))
    assert (step - after[-1]).abs().max().item() <= bound

    text = "".join(e.text for e in engine.generate(prepared, GREEDY) if isinstance(e, Delta))
    expected = greedy_from_scratch(engine, full_ids, GREEDY.max_tokens)
    assert text == engine.tokenizer.decode(expected, skip_special_tokens=True)


def test_prefix_blocks_kept_from_a_trimmed_cache_are_read_back_exactly(
    engine: PromptCacheEngine,
) -> None:
    """A conversation's second turn reads back blocks its first computed after a module:
    the blocks were cut from a cache whose sliding layers lacked the module's start."""
    first = engine.prepare_pml_source(f'<prompt schema="doc"><text/>{QUESTION * 3}</prompt>')
    engine.prefill(first)
    second = engine.prepare_pml_source(
        f'<prompt schema="doc"><text/>{QUESTION * 3} And its sea?</prompt>')
    logits, _, cache, reused = engine._prefill(second)
    assert reused > 0 and cache.sliding_skip > 0
    layout = engine.layouts["doc"]
    full_ids = (layout.segments[LEADING].token_ids + layout.segments["text"].token_ids
                + list(second.new_ids))
    reference, bound = rounded_reference(engine, TOLERANCE, input_ids=torch.tensor([full_ids]))
    assert (logits - reference[-1]).abs().max().item() <= bound


@given(positions=st.lists(st.integers(0, 500), max_size=40),
       first_query=st.integers(0, 600), window=st.integers(1, 64))
def test_only_states_no_query_can_reach_are_left_out(positions: list[int], first_query: int,
                                                      window: int) -> None:
    """Everything left out lies ``window`` or more behind every query at ``first_query`` or
    later, and the first state kept is within reach (no reachable state is lost, and no
    more is kept than the order of the cache forces)."""
    held = torch.tensor(positions, dtype=torch.long)
    skip = out_of_window(held, first_query, window)
    assert all(first_query - p >= window for p in positions[:skip])
    if skip < len(positions):
        assert first_query - positions[skip] < window
    assert out_of_window(held, first_query, None) == 0
