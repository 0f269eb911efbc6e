"""Our upstream server driven by the official `openai` client, as users of local LLMs
drive llama.cpp, Ollama or vLLM: the real server (builtin:tiny) on loopback."""

from collections.abc import Iterator

import openai
import pytest
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.wire import HONOURED, LABELS, UNSUPPORTED
from openai.types.chat.completion_create_params import CompletionCreateParamsBase

from tests.support.servers import running_upstream

KEY = "conformance-key"
MODEL = "builtin:tiny"
HELLO = [{"role": "user", "content": "Say hello"}]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    with running_upstream(MODEL, ServerSettings(api_key=KEY)) as url:
        yield f"{url}/v1"


@pytest.fixture
def client(base_url: str) -> Iterator[openai.OpenAI]:
    with openai.OpenAI(base_url=base_url, api_key=KEY, max_retries=0, timeout=60) as c:
        yield c


def test_every_field_of_the_api_is_honoured_labelled_or_refused() -> None:
    fields = set(CompletionCreateParamsBase.__annotations__) | {"stream"}
    assert fields - (HONOURED | LABELS | UNSUPPORTED.keys()) == set()
    assert HONOURED & LABELS == HONOURED & UNSUPPORTED.keys() == set()


def test_models_lists_the_served_model(client: openai.OpenAI) -> None:
    assert [m.id for m in client.models.list()] == [MODEL]


def test_a_whole_answer(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5,
                                                temperature=0, seed=3, user="tester")
    assert completion.model == MODEL and len(completion.choices) == 1
    choice = completion.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 5
    assert completion.usage.total_tokens == (completion.usage.prompt_tokens
                                             + completion.usage.completion_tokens)


def test_a_streamed_answer_with_usage_matches_the_whole_one(client: openai.OpenAI) -> None:
    whole = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=6,
                                           temperature=0)
    chunks = list(client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == \
        whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage is not None
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    without = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2,
                                                  temperature=0, stream=True))
    assert all(c.usage is None and c.choices for c in without)


def test_a_wrong_key_is_refused_with_401(base_url: str) -> None:
    with openai.OpenAI(base_url=base_url, api_key="wrong", max_retries=0) as stranger:
        with pytest.raises(openai.AuthenticationError) as refused:
            stranger.models.list()
    assert refused.value.status_code == 401 and refused.value.code == "invalid_api_key"


def test_an_unknown_model_is_a_404_in_openais_shape(client: openai.OpenAI) -> None:
    with pytest.raises(openai.NotFoundError) as missing:
        client.chat.completions.create(model="gpt-4o", messages=HELLO, max_tokens=2)
    assert missing.value.code == "model_not_found" and missing.value.param == "model"
    assert "'gpt-4o'" in missing.value.message and MODEL in missing.value.message
    assert missing.value.body["type"] == "invalid_request_error"


@pytest.mark.parametrize(("field", "value"), [
    ("n", 2),
    ("tools", [{"type": "function", "function": {"name": "f"}}]),
    ("logprobs", True),
    ("response_format", {"type": "json_object"}),
    ("top_logprobs", 3),
])
def test_a_field_the_server_cannot_honour_is_refused_by_name(
        client: openai.OpenAI, field: str, value: object) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2,
                                       extra_body={field: value})
    assert refused.value.status_code == 400 and refused.value.param == field
    assert f"'{field}'" in refused.value.message


def test_defaults_and_nulls_of_unsupported_fields_are_accepted(client: openai.OpenAI) -> None:
    completion = client.chat.completions.create(
        model=MODEL, messages=HELLO, max_tokens=2, n=1, logprobs=False, tools=[],
        response_format={"type": "text"}, frequency_penalty=0, presence_penalty=None,
        metadata={"run": "conformance"}, store=False, temperature=None, stop=None)
    assert len(completion.choices) == 1


def test_unknown_fields_and_stream_options_are_refused_by_name(client: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as unknown:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2,
                                       extra_body={"top_k": 40})
    assert unknown.value.param == "top_k" and "unknown field 'top_k'" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as obfuscated:
        client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=2, stream=True,
                                       stream_options={"include_obfuscation": True})
    assert obfuscated.value.param == "stream_options.include_obfuscation"
