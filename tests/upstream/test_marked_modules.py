"""Modules without writing PML (shared.pml.marks): a request marks messages in the
``Meancache-Modules`` header; the upstream keeps each as a module at its own positions,
so the same text after another history reads its states back, with the logits of one
pass over the same layout (the block mask of independent modules, as for PML)."""

import re
from typing import Any

import httpx
import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.shared.errors import PMLError
from meancache.shared.pml.marks import MAX_MARKS, MODULES_HEADER, parse_marks
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import MAX_MARKED_LAYOUTS, PromptCacheEngine
from meancache.upstream.prompt_cache.layout import LEADING

from tests.support.fuzz import fuzzed
from tests.support.kv_reference import reference_logits
from tests.support.servers import running_upstream

# The tests that compare numeric kernels' results (cached against uncached logits, a reused
# module's answer against one encoded anew) are marked `kernels`, as test_prompt_cache's:
# CI reruns them on AVX2 kernels. The rest check layouts, headers and the published schema.

TOLERANCE = 1e-4  # as test_prompt_cache: float32 summation order
DOCUMENT = ("The ferry leaves the north pier at seven and at noon; tickets are sold on "
            "board, and bicycles travel free on the first crossing of the day.")


def asked(history: list[dict[str, str]], question: str) -> list[dict[str, str]]:
    """``history``, then the document as a system message, then ``question``."""
    return [*history, {"role": "system", "content": DOCUMENT},
            {"role": "user", "content": question}]


@pytest.fixture(scope="module", params=["builtin:tiny", "builtin:tiny-gemma3"])
def engine(request: pytest.FixtureRequest) -> PromptCacheEngine:
    return PromptCacheEngine(load_model(request.param, device="cpu"))


@pytest.mark.kernels
def test_a_marked_document_after_another_history_is_read_back_exactly(
    engine: PromptCacheEngine,
) -> None:
    first = asked([], "When does the ferry leave?")
    engine.prefill(engine.prepare_marked(first, (0,)))
    encodings = engine.modules.encodings
    later = asked([{"role": "user", "content": "Hello there."},
                   {"role": "assistant", "content": "Hello! Ask me anything."}],
                  "Do bicycles pay?")
    prepared = engine.prepare_marked(later, (2,))
    assert [part for _, part in prepared.cached] == [LEADING, "m0"]
    assert prepared.marked_tokens == 0  # held: nothing to encode
    logits, seen, cache = engine.prefill(prepared)
    assert engine.modules.encodings == encodings  # read back, not encoded again
    reference, bound = reference_logits(engine, prepared, TOLERANCE)
    assert (logits - reference[-1]).abs().max().item() <= bound
    token = int(logits.argmax())
    step, _ = engine.decode_step(token, max(prepared.new_positions) + 1, seen, cache)
    after, bound = reference_logits(engine, prepared, TOLERANCE, [token])
    assert (step - after[-1]).abs().max().item() <= bound


@pytest.mark.kernels
def test_a_marked_leading_system_prompt_equals_the_ordinary_prompt(
    engine: PromptCacheEngine,
) -> None:
    """At the start, a module is the prefix the ordinary prompt begins with: the same
    tokens where the template's pieces tokenise alike, so the same logits."""
    messages = [{"role": "system", "content": DOCUMENT},
                {"role": "user", "content": "When?"}]
    marked = engine.prepare_marked(messages, (0,))
    plain = engine.prepare_messages(messages)
    assert engine.prompt_ids(marked) == list(plain.new_ids)
    logits, _, _ = engine.prefill(marked)
    reference, bound = reference_logits(engine, marked, TOLERANCE)
    assert (logits - reference[-1]).abs().max().item() <= bound


def test_marked_layouts_are_per_tenant_and_bounded() -> None:
    engine = PromptCacheEngine(load_model("builtin:tiny", device="cpu"))
    messages = asked([], "When?")
    engine.prefill(engine.prepare_marked(messages, (0,), tenant="a"))
    other = engine.prepare_marked(messages, (0,), tenant="b")
    assert other.cached[0][0] != engine.prepare_marked(messages, (0,), tenant="a").cached[0][0]
    assert other.marked_tokens > 0  # b computes it afresh
    for n in range(MAX_MARKED_LAYOUTS + 1):
        engine.prepare_marked([{"role": "system", "content": f"rule {n}"},
                               {"role": "user", "content": "?"}], (0,), tenant="a")
    assert sum(key.startswith("#marked:a:") for key in engine.layouts) == MAX_MARKED_LAYOUTS


@pytest.fixture(scope="module")
def base_url() -> str:
    with running_upstream("builtin:tiny") as url:
        yield url  # type: ignore[misc]


def ask(base_url: str, messages: list[dict[str, str]], marks: str | None
        ) -> openai.types.chat.ChatCompletion:
    client = openai.OpenAI(base_url=f"{base_url}/v1", api_key="unused")
    headers = {MODULES_HEADER: marks} if marks is not None else {}
    return client.chat.completions.create(model="builtin:tiny", messages=messages,  # type: ignore[arg-type]
                                          max_tokens=5, temperature=0, extra_headers=headers)


@pytest.mark.kernels
def test_the_server_serves_a_marked_document_from_its_module_in_another_conversation(
    base_url: str,
) -> None:
    first = ask(base_url, asked([], "When does the ferry leave?"), "0")
    history = [{"role": "user", "content": "Good morning."},
               {"role": "assistant", "content": "Good morning to you."}]
    later = asked(history, "Do bicycles pay?")
    second = ask(base_url, later, "2")
    assert first.usage is not None and second.usage is not None
    first_cached = first.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    second_cached = second.usage.prompt_tokens_details.cached_tokens  # type: ignore[union-attr]
    document_tokens = len(DOCUMENT.encode())  # builtin:tiny's tokenizer is byte-level
    assert first_cached < document_tokens <= second_cached
    with running_upstream("builtin:tiny") as fresh:  # the same request, module encoded anew
        again = ask(fresh, later, "2")
    assert again.choices[0].message.content == second.choices[0].message.content
    plain = ask(base_url, later, None)  # unmarked: the document read in place, not reused
    assert plain.usage.prompt_tokens_details.cached_tokens < document_tokens  # type: ignore[union-attr]


@pytest.mark.parametrize(("marks", "says"), [
    ("0,0", "twice"), ("x", "indices separated by commas"), ("", "indices separated"),
    ("1", "the last one is the question"), ("7", "the last one is the question"),
    (",".join(str(i) for i in range(MAX_MARKS + 1)), "at most"),
    ("1" * 65, "characters"), ("-1", "indices separated"), ("\u0661", "indices separated"),
])
def test_a_bad_marks_header_is_a_400_naming_it(base_url: str, marks: str, says: str) -> None:
    messages = asked([], "When?") if "," not in marks else [
        {"role": "system", "content": f"part {i}"} for i in range(MAX_MARKS + 2)
    ] + [{"role": "user", "content": "?"}]
    response = httpx.post(f"{base_url}/v1/chat/completions",
                          headers={MODULES_HEADER: marks.encode()},
                          json={"model": "builtin:tiny", "messages": messages,
                                "max_tokens": 2})
    assert response.status_code == 400, response.text
    message = response.json()["error"]["message"]
    assert MODULES_HEADER in message and says in message


def test_marked_messages_count_toward_the_prompt_limit() -> None:
    from meancache.upstream.server.app import ServerSettings
    from meancache.upstream.server.limits import Limits

    with running_upstream("builtin:tiny", ServerSettings(
            limits=Limits(max_prompt_tokens=len(DOCUMENT.encode())))) as url:
        response = httpx.post(f"{url}/v1/chat/completions", headers={MODULES_HEADER: "0"},
                              json={"model": "builtin:tiny", "max_tokens": 2,
                                    "messages": asked([], "When does the ferry leave?")})
    assert response.status_code == 400 and "new tokens" in response.json()["error"]["message"]


def test_marks_with_a_pml_prompt_are_refused(base_url: str) -> None:
    response = httpx.post(f"{base_url}/v1/chat/completions", headers={MODULES_HEADER: "0"},
                          json={"model": "builtin:tiny", "max_tokens": 2, "messages": [
                              {"role": "system", "content": DOCUMENT},
                              {"role": "user", "content": '<prompt schema="x">hi</prompt>'}]})
    assert response.status_code == 400 and "one or the other" in response.text



def published_marks(base_url: str) -> dict[str, Any]:
    """The header parameter /openapi.json gives the chat completions operation."""
    document = httpx.get(f"{base_url}/openapi.json").json()
    parameters = document["paths"]["/v1/chat/completions"]["post"]["parameters"]
    [header] = [p for p in parameters if p["name"] == MODULES_HEADER]
    return dict(header)


def test_the_marks_header_is_published_in_openapi(base_url: str) -> None:
    header = published_marks(base_url)
    assert header["in"] == "header" and header["required"] is False
    assert header["schema"]["type"] == "string"
    assert "messages" in header["description"] and "400" in header["description"]
    example = header["example"]
    assert re.fullmatch(header["schema"]["pattern"], example)
    messages = [{"role": "system", "content": f"part {i}"} for i in range(3)] + [
        {"role": "user", "content": "Which part?"}]
    response = httpx.post(f"{base_url}/v1/chat/completions", headers={MODULES_HEADER: example},
                          json={"model": "builtin:tiny", "messages": messages, "max_tokens": 2})
    assert response.status_code == 200, response.text  # the example is a value it takes


@fuzzed(max_examples=80)
@given(data=st.data())
def test_the_published_schema_says_which_headers_the_upstream_reads(
        base_url: str, data: st.DataObject) -> None:
    """A value the published schema allows, its indices distinct and before the question,
    is taken (shared.pml.marks.parse_marks, as the server reads it); a value it does not
    allow is refused, whatever the messages."""
    schema = published_marks(base_url)["schema"]
    allowed = data.draw(st.from_regex(schema["pattern"], fullmatch=True).filter(
        lambda value: len(value) <= schema["maxLength"]))
    indices = [int(part) for part in allowed.split(",")]
    if len(set(indices)) == len(indices):
        assert parse_marks(allowed, max(indices) + 2) == tuple(sorted(indices))
    other = data.draw(st.text(alphabet="0123456789, \t-x+\u0661", max_size=80))
    if not (re.fullmatch(schema["pattern"], other) and len(other) <= schema["maxLength"]):
        with pytest.raises(PMLError):
            parse_marks(other, 10**7)
