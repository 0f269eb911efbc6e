"""Automatic prefix reuse: a prompt that starts with tokens an earlier prompt of the same
tenant computed reads their states back in whole blocks, computes only the rest, and gets
the logits a full prefill gives.

References are plain forward passes over every token from position 0, with no cache and no
mask: the model builds its own masks (Gemma 3's sliding window included), so the reference
shares no code with the reuse path.
"""

import random
import re
from collections.abc import Iterator

import httpx
import openai
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from meancache.upstream.model_loading import LoadedModel, load_model
from meancache.upstream.precision import KV_FORMATS
from meancache.upstream.prompt_cache.engine import (
    LOCAL_TENANT,
    Delta,
    Finish,
    PreparedPrompt,
    PromptCacheEngine,
)
from meancache.upstream.prompt_cache.prefixes import BLOCK_TOKENS, chain, namespace, root
from meancache.upstream.prompt_cache.states import concatenate
from meancache.upstream.sampling import SamplingParams
from meancache.upstream.server.app import ServerSettings

from tests.support.kv_reference import rounded_reference
from tests.support.servers import running_upstream

pytestmark = pytest.mark.kernels  # compares numeric kernels' results, as test_prompt_cache

# Reused and fresh paths differ only in float32 summation order: float32 eps (1.2e-7) x
# the longest reduction (hidden 64-256, attention over < 300 positions) x the size of the
# values (below ~5 in these tiny models): ~1e-4, as in test_prompt_cache.
TOLERANCE = 1e-4
B = BLOCK_TOKENS
GREEDY = SamplingParams(max_tokens=6, temperature=0.0)
SYSTEM = ("You are a patient guide to the rivers of Europe. Answer in two sentences, name "
          "the river, and say which sea it reaches.")
QUESTIONS = ["Which river runs through Vienna?", "And through Budapest?",
             "Which sea does it reach?", "How long is it?"]


@pytest.fixture(scope="module", params=["builtin:tiny", "builtin:tiny-gemma3",
                                        "builtin:tiny-gpt2"])
def loaded(request: pytest.FixtureRequest) -> LoadedModel:
    """Llama (rotary), Gemma 3 (sliding-window layers, window 12 < a block of 16 and far
    below the prompts) and GPT-2 (learned absolute positions)."""
    return load_model(request.param, device="cpu")


@pytest.fixture(scope="module", params=KV_FORMATS)
def kv_format(request: pytest.FixtureRequest) -> str:
    return request.param


def full_logits(engine: PromptCacheEngine, ids: list[int]) -> tuple[torch.Tensor, float]:
    """A full prefill's logits (states rounded to the engine's KV format), and the bound."""
    return rounded_reference(engine, TOLERANCE, input_ids=torch.tensor([ids]))


def plain(ids: list[int], tenant: str = LOCAL_TENANT) -> PreparedPrompt:
    return PreparedPrompt((), tuple(ids), tuple(range(len(ids))), tenant)


def expected_reuse(earlier: list[list[int]], ids: list[int]) -> int:
    """Whole blocks of the longest prefix shared with an earlier prompt, leaving at least
    the last token to compute."""
    def common(a: list[int], b: list[int]) -> int:
        pairs = enumerate(zip(a, b, strict=False))  # the shorter one's length at most
        return next((i for i, (x, y) in pairs if x != y), min(len(a), len(b)))

    shared = max((common(ids, other) for other in earlier), default=0)
    return B * min(shared // B, (len(ids) - 1) // B)


def assert_exact(engine: PromptCacheEngine, prepared: PreparedPrompt, expected: int) -> None:
    """The reuse path reads ``expected`` tokens back, and its logits and next step's equal
    a full prefill's."""
    ids = list(prepared.new_ids)
    logits, seen, cache, reused = engine._prefill(prepared)
    assert reused == expected
    reference, bound = full_logits(engine, ids)
    assert (logits - reference[-1]).abs().max().item() <= bound
    token = int(logits.argmax())
    step, _ = engine.decode_step(token, len(ids), seen, cache)
    after, bound = full_logits(engine, [*ids, token])
    assert (step - after[-1]).abs().max().item() <= bound


def test_a_growing_conversation_reads_its_history_back_exactly(loaded: LoadedModel,
                                                               kv_format: str) -> None:
    engine = PromptCacheEngine(loaded, kv_format=kv_format)
    messages = [{"role": "system", "content": SYSTEM}]
    earlier: list[list[int]] = []
    for turn, question in enumerate(QUESTIONS):
        messages.append({"role": "user", "content": question})
        prepared = engine.prepare_messages(messages)
        ids = list(prepared.new_ids)
        expected = expected_reuse(earlier, ids)
        if turn:  # the template renders the previous prompt as this one's start
            assert ids[:len(earlier[-1])] == earlier[-1] and expected > 0
        assert_exact(engine, prepared, expected)
        earlier.append(ids)
        messages.append({"role": "assistant", "content": f"The Danube, turn {turn}."})


def test_the_blocks_kept_hold_the_states_of_a_full_prefill(loaded: LoadedModel,
                                                            kv_format: str) -> None:
    """In the store's format; equal to a full prefill's rounded states up to summation
    order, or one step of the format where that order moved a value across a rounding
    boundary (a step is twice the largest rounding error, so within error_bound x 2)."""
    from tests.support.kv_reference import error_bound

    engine = PromptCacheEngine(loaded, kv_format=kv_format)
    prepared = engine.prepare_messages([{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": QUESTIONS[0]}])
    ids = list(prepared.new_ids)
    engine.prefill(prepared)
    cache = engine.new_cache()
    with torch.inference_mode():
        engine.model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
    keys = chain(root(loaded.name, []), LOCAL_TENANT, ids, range(len(ids)))
    assert len(keys) == len(ids) // B
    for index, key in enumerate(keys):
        block = engine.modules.find(key)
        assert block is not None and block.positions.tolist() == list(
            range(index * B, (index + 1) * B))
        assert block.nbytes == B * engine.bytes_per_token
        unpacked, _ = concatenate([block], engine.kv_format)
        for ours, whole in zip(unpacked.layers, cache.layers, strict=True):
            for kept, full in ((ours.keys, whole.keys), (ours.values, whole.values)):
                full = full[:, :, index * B:(index + 1) * B]
                assert ((kept - full).abs() <= TOLERANCE + 2 * error_bound(kv_format, full)
                        ).all()


@settings(max_examples=12, deadline=None)
@example(first=60, diverge=37, second=70, seed=1)  # mid-block: 2 blocks shared, 5 tokens not
@example(first=60, diverge=32, second=70, seed=2)  # on a block boundary
@given(first=st.integers(1, 90), diverge=st.integers(0, 90), second=st.integers(1, 90),
       seed=st.integers(0, 2**32 - 1))
def test_a_prompt_diverging_anywhere_reuses_only_its_shared_whole_blocks(
    loaded: LoadedModel, kv_format: str, first: int, diverge: int, second: int, seed: int,
) -> None:
    """Two prompts of random tokens that agree on their first ``diverge`` tokens, mid-block
    or on a boundary: the second reads back the shared whole blocks, no more."""
    rng = random.Random(seed)
    engine = PromptCacheEngine(loaded, kv_format=kv_format)
    a = [rng.randrange(256) for _ in range(first)]
    b = a[:diverge] + [rng.randrange(256) for _ in range(max(second - diverge, 0))]
    if len(b) > diverge and diverge < len(a) and b[diverge] == a[diverge]:
        b[diverge] = (a[diverge] + 1) % 256  # they diverge exactly there
    engine.prefill(plain(a))
    assert_exact(engine, plain(b), expected_reuse([a], b))


def test_the_same_prompt_repeated_gives_the_same_answer_from_its_blocks(
    loaded: LoadedModel, kv_format: str,
) -> None:
    engine = PromptCacheEngine(loaded, kv_format=kv_format)
    prepared = engine.prepare_messages([{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": QUESTIONS[0]}])
    answers = [list(engine.generate(prepared, GREEDY)) for _ in range(2)]
    first, second = (events[-1] for events in answers)
    assert isinstance(first, Finish) and isinstance(second, Finish)
    n = len(prepared.new_ids)
    assert (first.cached_tokens, first.prefix_tokens) == (0, 0)
    assert second.cached_tokens == second.prefix_tokens == B * ((n - 1) // B)
    assert first.prompt_tokens == second.prompt_tokens == n
    texts = ["".join(e.text for e in events if isinstance(e, Delta)) for events in answers]
    assert texts[0] == texts[1]
    assert_exact(engine, prepared, B * ((n - 1) // B))


TRAVEL = """<schema name="travel">
  <system>You are a helpful travel assistant.</system>
  <module name="city">Facts about <param name="name" len="12"/>, a city worth seeing.</module>
  <module name="budget">Keep the budget under <param name="amount" len="6"/> euros.</module>
</schema>"""


def test_a_pml_prompt_reuses_its_history_after_the_modules_exactly() -> None:
    """The text after a schema's modules (earlier messages, the question) and the arguments
    (earlier in position, and here given in another order than their positions) are prefix
    blocks too, chained after the modules."""
    loaded = load_model("builtin:tiny-gemma3", device="cpu")
    engines = [PromptCacheEngine(loaded, prefix_reuse=reuse) for reuse in (True, False)]
    history = [{"role": "user", "content": "Tell me about the old town and its bridges."},
               {"role": "assistant", "content": "The old town sits on a bend of the river."}]
    prompt = ('<prompt schema="travel"><budget amount="500"/><city name="Lyon"/>'
              "<user>What should I see first?</user></prompt>")
    messages = [*history, {"role": "user", "content": prompt}]
    results = []
    for engine in engines:
        engine.add_schema(TRAVEL)
        prepared = engine.prepare_messages(messages)
        engine.prefill(prepared)
        results.append(engine._prefill(prepared))
    (reused_logits, *_, reused), (fresh_logits, *_, none) = results
    assert none == 0 and reused == B * ((len(prepared.new_ids) - 1) // B) > 0
    assert (reused_logits - fresh_logits).abs().max().item() <= TOLERANCE
    other = engines[0].prepare_messages([*history, {"role": "user", "content": prompt.replace(
        "<budget amount=\"500\"/>", "")}])
    assert engines[0]._prefill(other)[3] == 0  # other modules: another chain


def test_arguments_given_out_of_position_order_are_chained_in_position_order() -> None:
    """The amount comes first in the prompt but sits after the city's name: a block of the
    amount's tokens depends on the name, so two prompts that differ only in the name share
    no block (blocks of 4 tokens, so that the amount fills one)."""
    loaded = load_model("builtin:tiny", device="cpu")
    reuse, fresh = (PromptCacheEngine(loaded, prefix_reuse=on, block_tokens=4)
                    for on in (True, False))
    logits = []
    for engine in (reuse, fresh):
        engine.add_schema(TRAVEL)
        for city in ("Lyon", "Nice"):
            prepared = engine.prepare_messages([{"role": "user", "content": (
                f'<prompt schema="travel"><budget amount="500000"/><city name="{city}"/>'
                "<user>Where?</user></prompt>")}])
            found = engine._prefill(prepared)
        assert found[3] == 0
        logits.append(found[0])
    assert (logits[0] - logits[1]).abs().max().item() <= TOLERANCE


def test_a_tenant_never_reads_another_tenants_prefixes() -> None:
    engine = PromptCacheEngine(load_model("builtin:tiny", device="cpu"))
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "Hi"}]
    reused = {}
    for tenant in ("alice", "bob", "alice", "bob"):
        prepared = engine.prepare_messages(messages, tenant)
        finish = list(engine.generate(prepared, GREEDY))[-1]
        assert isinstance(finish, Finish)
        reused.setdefault(tenant, []).append(finish.cached_tokens)
    assert reused["alice"][0] == reused["bob"][0] == 0  # bob computes afresh
    assert reused["alice"][1] == reused["bob"][1] > 0
    spaces = {key[0] for key in engine.modules._states}
    assert spaces == {namespace("alice"), namespace("bob")}


def test_with_reuse_off_every_prompt_is_computed_and_nothing_kept() -> None:
    engine = PromptCacheEngine(load_model("builtin:tiny", device="cpu"), prefix_reuse=False)
    prepared = engine.prepare_messages([{"role": "system", "content": SYSTEM},
                                        {"role": "user", "content": "Hi"}])
    for _ in range(2):
        finish = list(engine.generate(prepared, GREEDY))[-1]
        assert isinstance(finish, Finish) and finish.cached_tokens == 0
    assert engine.modules.tokens == 0


def test_blocks_and_modules_share_one_budget_and_its_lru_order() -> None:
    """Blocks push out the least recently used module and the other way round; a chain
    loses its tail before its start; the store never holds more than its budget."""
    loaded = load_model("builtin:tiny", device="cpu")
    per_block = B * PromptCacheEngine(loaded).bytes_per_token
    engine = PromptCacheEngine(loaded, module_budget_bytes=6 * per_block)
    engine.add_schema('<schema name="doc"><module name="text">'
                      + "A note on bridges. " * 2 + "</module></schema>")  # 38 + 1 tokens
    module = ("doc", "text")
    assert module in engine.modules
    rng = random.Random(0)
    a = [rng.randrange(256) for _ in range(4 * B + 1)]
    b = [rng.randrange(256) for _ in range(3 * B + 1)]

    def reused(ids: list[int]) -> int:
        count = engine._prefill(plain(ids))[3]
        assert engine.modules.nbytes <= engine.modules.budget_bytes
        return count

    assert reused(a) == 0  # 4 blocks: with the module's 39 tokens over the 96 of the budget
    assert module not in engine.modules and engine.modules.evictions > 0
    assert reused(b) == 0  # 3 more blocks push out a's last block, not its first
    assert reused(a) == 3 * B
    encodings = engine.modules.encodings
    ask = engine.prepare_messages([{"role": "user",
                                    "content": '<prompt schema="doc"><text/>Why?</prompt>'}])
    list(engine.generate(ask, SamplingParams(max_tokens=1)))
    assert engine.modules.encodings > encodings  # encoded again, pushing blocks out
    assert engine.modules.nbytes <= engine.modules.budget_bytes
    assert reused(b) < 3 * B


def test_a_chain_longer_than_the_budget_keeps_its_start() -> None:
    loaded = load_model("builtin:tiny", device="cpu")
    per_block = B * PromptCacheEngine(loaded).bytes_per_token
    engine = PromptCacheEngine(loaded, module_budget_bytes=2 * per_block)
    ids = list(range(5 * B + 3))
    engine.prefill(plain(ids))
    assert engine.modules.nbytes == 2 * per_block
    assert_exact(engine, plain(ids), 2 * B)


# --- through the real server, with the official openai client ---------------------------

OWNER, OTHER = "key-of-owner", "key-of-other"


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with running_upstream(settings=ServerSettings(api_key=OWNER, api_keys=(OTHER,))) as url:
        yield f"{url}/v1"


def as_key(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0, timeout=60)


def streamed_usage(client: openai.OpenAI, messages: list[dict[str, str]]) -> tuple[str, int]:
    """The answer and its usage's cached_tokens, streamed as the chat and the proxy ask."""
    text, cached = "", None
    for chunk in client.chat.completions.create(
            model="builtin:tiny", messages=messages, max_tokens=4, temperature=0, stream=True,
            stream_options={"include_usage": True}):
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            details = chunk.usage.prompt_tokens_details
            assert details is not None and details.cached_tokens is not None
            cached = details.cached_tokens
    assert cached is not None
    return text, cached


def prefix_counter(base_url: str) -> float:
    metrics = httpx.get(base_url.removesuffix("/v1") + "/metrics", timeout=60,
                        headers={"Authorization": f"Bearer {OWNER}"}).text
    found = re.search(r"^meancache_upstream_prefix_reused_tokens_total (\S+)$", metrics, re.M)
    assert found, metrics
    return float(found.group(1))


def test_a_conversation_sees_cached_tokens_from_its_second_turn(base_url: str) -> None:
    before = prefix_counter(base_url)
    messages = [{"role": "system", "content": "(conversation) " + SYSTEM}]
    cached = []
    with as_key(base_url, OWNER) as client:
        for question in QUESTIONS[:3]:
            messages.append({"role": "user", "content": question})
            answer, tokens = streamed_usage(client, messages)
            cached.append(tokens)
            messages.append({"role": "assistant", "content": answer or "I do not know."})
        whole = client.chat.completions.create(model="builtin:tiny", messages=messages[:-1],
                                               max_tokens=4, temperature=0)
    assert cached[0] == 0 and 0 < cached[1] < cached[2]
    assert whole.usage is not None and whole.usage.prompt_tokens_details is not None
    assert whole.usage.prompt_tokens_details.cached_tokens == B * (
        (whole.usage.prompt_tokens - 1) // B)  # the same prompt as the last turn's
    reported = sum(cached) + whole.usage.prompt_tokens_details.cached_tokens
    assert prefix_counter(base_url) - before == reported


def test_the_same_prompt_under_another_key_is_computed_afresh(base_url: str) -> None:
    messages = [{"role": "system", "content": "(tenants) " + SYSTEM},  # no earlier start
                {"role": "user", "content": "What does my key reveal?"}]
    with as_key(base_url, OWNER) as owner, as_key(base_url, OTHER) as other:
        _, owner_first = streamed_usage(owner, messages)
        _, other_first = streamed_usage(other, messages)
        _, owner_again = streamed_usage(owner, messages)
        _, other_again = streamed_usage(other, messages)
    assert owner_first == other_first == 0
    assert owner_again == other_again > 0
