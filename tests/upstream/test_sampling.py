"""The repetition guard: penalties as llama.cpp and OpenAI define them, the loop stop, and
the request fields and server defaults that set them."""

from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from meancache.upstream.errors import BadRequest
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import Finish, PromptCacheEngine
from meancache.upstream.sampling import (
    DRY_LONGEST,
    LOOP_NGRAM,
    LOOP_REPEATS,
    History,
    next_token,
)
from meancache.upstream.sampling_params import SERVER_DEFAULTS, SamplingParams
from meancache.upstream.server.wire import parse_chat_request

GREEDY = SamplingParams(max_tokens=300, temperature=0.0)


def test_the_repetition_penalty_lowers_tokens_in_the_window_only() -> None:
    params = SamplingParams(repetition_penalty=2.0, repetition_window=3)
    history = History([9, 1, 2], params)  # 9 falls out of the window with the next token
    history.add(3)
    logits = torch.tensor([4.0, 4.0, -4.0, 1.0, 5.0, 0.5, 0.5, 0.5, 0.5, 6.0])
    out = history.penalise(logits)
    assert out.tolist() == [4.0, 2.0, -8.0, 0.5, 5.0, 0.5, 0.5, 0.5, 0.5, 6.0]
    assert logits[1] == 4.0  # the model's own logits are left as they were


def test_frequency_and_presence_penalties_count_the_answer_only() -> None:
    params = SamplingParams(frequency_penalty=0.5, presence_penalty=1.0, repetition_window=0)
    history = History([0, 0, 0], params)  # prompt tokens: not counted
    for token in (1, 1, 2):
        history.add(token)
    out = history.penalise(torch.zeros(4))
    assert out.tolist() == [0.0, -2.0, -1.5, 0.0]  # 2 x 0.5 + 1, 1 x 0.5 + 1


def brute_force_runs(answer: list[int]) -> dict[int, int]:
    """DRY's definition read literally: for every earlier place ``at`` of a token, the
    longest common run of tokens ending at ``at`` and at the answer's end, credited to the
    token that followed ``at``."""
    runs: dict[int, int] = {}
    end = len(answer) - 1
    for at in range(end):
        run = 0
        while run <= at and answer[at - run] == answer[end - run]:
            run += 1
        if run:
            runs[answer[at + 1]] = max(min(run, DRY_LONGEST), runs.get(answer[at + 1], 0))
    return runs


@given(st.lists(st.integers(0, 3), max_size=80))
def test_dry_finds_the_longest_run_each_token_would_repeat(answer: list[int]) -> None:
    history = History([], SamplingParams(dry_multiplier=1.0))
    for token in answer:
        history.add(token)
    assert history.repeated_runs() == brute_force_runs(answer)


def test_dry_lowers_a_token_by_base_to_the_run_beyond_the_allowed_length() -> None:
    params = SamplingParams(dry_multiplier=0.5, dry_base=2.0, dry_allowed_length=2,
                            repetition_window=0)
    history = History([7, 7, 7], params)
    for token in (1, 2, 3, 4, 9, 1, 2, 3):  # "1 2 3" said again: 4 would make it 4 long
        history.add(token)
    out = history.penalise(torch.zeros(10))  # 4 would repeat "1 2 3 4": 0.5 x 2^(3 - 2)
    assert out.tolist() == [0.0, 0.0, 0.0, 0.0, -1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    history.add(4)
    assert history.penalise(torch.zeros(10))[9] == -0.5 * 2.0 ** 2  # "1 2 3 4" then 9


def test_dry_reads_the_prompt_too_so_an_answer_cannot_copy_the_question_back() -> None:
    params = SamplingParams(dry_multiplier=1.0, dry_allowed_length=2, repetition_window=0)
    history = History([5, 6, 7, 8], params)
    for token in (5, 6, 7):  # the question's first three tokens said back
        history.add(token)
    assert history.repeated_runs() == {8: 3}
    assert history.penalise(torch.zeros(10))[8] == -1.75


def test_dry_lets_runs_up_to_the_allowed_length_repeat() -> None:
    params = SamplingParams(dry_multiplier=1.0, dry_allowed_length=3, repetition_window=0)
    history = History([], params)
    for token in (1, 2, 5, 1, 2):  # "1 2" again: 5 would repeat a run of 2 < 3
        history.add(token)
    assert history.penalise(torch.zeros(6)).tolist() == [0.0] * 6


@given(penalty=st.floats(min_value=5e-324, max_value=2.0),
       temperature=st.floats(min_value=0.0, max_value=2.0),
       top_p=st.floats(min_value=0.0, max_value=1.0, exclude_min=True),
       seed=st.integers(0, 2**31))
def test_any_penalty_in_range_still_gives_a_token(penalty: float, temperature: float,
                                                  top_p: float, seed: int) -> None:
    """A repetition_penalty anywhere in (0, 2] (the fuzz test found 3.5e-87) with any
    temperature and top_p: a token is picked, and where the penalty took the seen tokens'
    logits out of float32's range, it is one of them (the limit of the softmax)."""
    params = SamplingParams(repetition_penalty=penalty, repetition_window=4,
                            temperature=temperature, top_p=top_p)
    history = History([1, 2], params)
    logits = torch.tensor([3.0, 5.0, 4.0, -1.0, 2.0, float("nan"), float("-inf")])
    penalised = history.penalise(logits)
    token = next_token(penalised, params, torch.Generator().manual_seed(seed))
    assert 0 <= token < 5  # never the NaN or the -inf logit
    if torch.isinf(penalised[1:3]).all():
        assert token in (1, 2)


def test_no_penalty_leaves_the_logits_object_alone() -> None:
    logits = torch.randn(8)
    assert History([1, 2], GREEDY).penalise(logits) is logits


@pytest.fixture(scope="module")
def engine() -> PromptCacheEngine:
    return PromptCacheEngine(load_model("builtin:tiny", device="cpu"))


PROMPT = [{"role": "user", "content": "say it again"}]


def answer(engine: PromptCacheEngine, params: SamplingParams) -> Finish:
    events = list(engine.generate(engine.prepare_messages(PROMPT), params))
    assert isinstance(events[-1], Finish)
    return events[-1]


def first_loop(engine: PromptCacheEngine) -> int | None:
    """Where the greedy answer's n-gram count first reaches LOOP_REPEATS (None: never),
    counted on the tokens this CPU's greedy path chooses."""
    prepared = engine.prepare_messages(PROMPT)
    logits, seen, cache = engine.prefill(prepared)
    last = max(prepared.new_positions)
    tokens: list[int] = []
    counts: Counter[tuple[int, ...]] = Counter()
    for produced in range(1, GREEDY.max_tokens + 1):
        tokens.append(int(logits.argmax()))
        if len(tokens) >= LOOP_NGRAM:
            counts[tuple(tokens[-LOOP_NGRAM:])] += 1
            if counts[tuple(tokens[-LOOP_NGRAM:])] >= LOOP_REPEATS:
                return produced
        last += 1
        logits, seen = engine.decode_step(tokens[-1], last, seen, cache)
    return None


def test_the_loop_stop_ends_an_answer_at_its_repeated_ngram(engine: PromptCacheEngine) -> None:
    """The untrained model's greedy answer falls into a cycle (checked on this CPU's
    answer, not assumed); the loop stop cuts that same answer where one n-gram reaches
    LOOP_REPEATS occurrences, and not a token earlier."""
    stop_at = first_loop(engine)
    assert stop_at is not None, "this greedy answer never loops: the premise does not hold"
    unguarded = answer(engine, GREEDY)
    guarded = answer(engine, replace(GREEDY, stop_on_loops=True))
    assert unguarded.reason == "length" and unguarded.completion_tokens == GREEDY.max_tokens
    assert guarded.reason == "loop" and guarded.completion_tokens == stop_at


def test_request_fields_override_the_server_defaults() -> None:
    body = {"messages": [{"role": "user", "content": "hi"}]}
    plain = parse_chat_request(body, SERVER_DEFAULTS, "m").params
    assert (plain.repetition_penalty, plain.repetition_window, plain.stop_on_loops) == (
        SERVER_DEFAULTS.repetition_penalty, SERVER_DEFAULTS.repetition_window, True)
    asked = parse_chat_request({**body, "repetition_penalty": 1, "stop_on_loops": False,
                                "repetition_window": 8, "frequency_penalty": 0.5,
                                "presence_penalty": -0.25, "dry_multiplier": 0,
                                "dry_base": 2, "dry_allowed_length": 4},
                               SERVER_DEFAULTS, "m").params
    assert (asked.repetition_penalty, asked.repetition_window, asked.stop_on_loops,
            asked.frequency_penalty, asked.presence_penalty) == (1.0, 8, False, 0.5, -0.25)
    assert (asked.dry_multiplier, asked.dry_base, asked.dry_allowed_length) == (0.0, 2.0, 4)


@pytest.mark.parametrize(("field", "value", "message"), [
    ("repetition_penalty", 0, r"repetition_penalty must lie in \(0, 2\]"),
    ("repetition_penalty", "high", "'repetition_penalty' must be a number"),
    ("repetition_window", 1.5, "'repetition_window' must be a number \\(an integer\\)"),
    ("stop_on_loops", "yes", "'stop_on_loops' must be true or false"),
    ("frequency_penalty", 3, r"frequency_penalty must lie in \[-2, 2\]"),
    ("presence_penalty", -2.5, r"presence_penalty must lie in \[-2, 2\]"),
    ("dry_multiplier", -1, r"dry_multiplier must lie in \[0, 8\]"),
    ("dry_base", 0.5, r"dry_base must lie in \[1, 4\]"),
    ("dry_allowed_length", 0, r"dry_allowed_length must lie in \[1, 64\]"),
    ("dry_allowed_length", 2.5, "'dry_allowed_length' must be a number \\(an integer\\)"),
])
def test_bad_guard_fields_are_refused_by_name(field: str, value: object, message: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], field: value}
    with pytest.raises(BadRequest, match=message):
        parse_chat_request(body, SERVER_DEFAULTS, "m")


def test_the_server_takes_the_guard_fields_from_the_openai_sdk(
        upstream_url: str, engine: PromptCacheEngine) -> None:
    """The session's server runs the same builtin:tiny: asked through the SDK with the
    guard's fields, it stops where the engine's loop stop stops."""
    from openai import BadRequestError, OpenAI

    client = OpenAI(base_url=f"{upstream_url}/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="builtin:tiny", messages=PROMPT, max_tokens=GREEDY.max_tokens, temperature=0,
        extra_body={"repetition_penalty": 1.0, "dry_multiplier": 0, "stop_on_loops": True})
    guarded = answer(engine, replace(GREEDY, stop_on_loops=True))
    assert reply.choices[0].finish_reason == "stop"  # the loop stop is an OpenAI "stop"
    assert reply.usage is not None
    assert reply.usage.completion_tokens == guarded.completion_tokens
    with pytest.raises(BadRequestError, match="repetition_penalty"):
        client.chat.completions.create(model="builtin:tiny", messages=PROMPT,
                                       extra_body={"repetition_penalty": 9})
