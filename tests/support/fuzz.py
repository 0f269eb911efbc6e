"""The fuzz suites' seed, settings and request strategies: every run draws new inputs from
a seed it prints (the report header: ``fuzz seed N``), and ``MEANCACHE_FUZZ_SEED=N``
replays that run. CI runs a small share (``FUZZ_EXAMPLES``); benchmarks/fuzz_servers.py
runs the same strategies by the thousand against each server."""

import json
import os
import secrets
from collections.abc import Callable
from typing import Any, TypeVar

import httpx
from hypothesis import HealthCheck, seed, settings
from hypothesis import strategies as st

FUZZ_SEED = int(os.environ.get("MEANCACHE_FUZZ_SEED") or secrets.randbits(32))
FUZZ_EXAMPLES = 60  # per property in CI: the benchmark runs the thousands

T = TypeVar("T", bound=Callable[..., object])


def fuzzed(max_examples: int = FUZZ_EXAMPLES) -> Callable[[T], T]:
    """Hypothesis settings for a fuzz property: drawn from FUZZ_SEED (not derandomised, so
    each run differs), no deadline (servers on loopback on a shared machine)."""
    def decorate(test: T) -> T:
        configured = settings(max_examples=max_examples, deadline=None, derandomize=False,
                              suppress_health_check=[HealthCheck.too_slow,
                                                     HealthCheck.function_scoped_fixture,
                                                     HealthCheck.data_too_large,
                                                     HealthCheck.filter_too_much])(test)
        return seed(FUZZ_SEED)(configured)

    return decorate


# What a careless or hostile client sends: any small JSON value.
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=20)
                    | st.floats(allow_nan=False, allow_infinity=False),
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=10), inner, max_size=4), max_leaves=12)
# Text a user may type (any character JSON carries in UTF-8: no lone surrogates).
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=60)


@st.composite
def chat_requests(draw: st.DrawFn, model: str, max_tokens: int) -> dict[str, Any]:
    """A valid OpenAI chat request for ``model`` that the proxy and the upstream both
    serve: an optional system message, earlier turns, the question; at most
    ``max_tokens`` tokens (so that a fuzz run's answers stay short); streamed or not."""
    messages = [{"role": "system", "content": draw(TEXT)}] if draw(st.booleans()) else []
    for _ in range(draw(st.integers(0, 2))):
        messages += [{"role": "user", "content": draw(TEXT)},
                     {"role": "assistant", "content": draw(TEXT)}]
    messages.append({"role": "user", "content": draw(TEXT)})
    body: dict[str, Any] = {"model": model, "messages": messages,
                            "max_tokens": draw(st.integers(1, max_tokens))}
    if draw(st.booleans()):
        body["temperature"] = draw(st.floats(0, 2))
    if draw(st.booleans()):
        body["stream"] = True
        if draw(st.booleans()):
            body["stream_options"] = {"include_usage": True}
    return body


CHAT_FIELDS = ["model", "messages", "stream", "stream_options", "max_tokens", "temperature",
               "n", "tools", "stop", "top_p", "role", "content"]
MESSAGE = st.fixed_dictionaries({}, optional={
    "role": st.sampled_from(["user", "assistant", "system", "tool", "x"]) | JSON,
    "content": st.text(max_size=30) | JSON})


def chat_bodies(model: str) -> st.SearchStrategy[bytes]:
    """Bodies for POST /v1/chat/completions, mostly broken: any JSON, any bytes, and the
    chat request's fields with any values (``model`` or anything as the model)."""
    return st.one_of(
        JSON.map(lambda value: json.dumps(value).encode()),
        st.binary(max_size=60),
        st.fixed_dictionaries({}, optional={
            **{name: JSON for name in CHAT_FIELDS},
            "model": st.just(model) | JSON,
            "messages": st.lists(MESSAGE, max_size=3) | JSON,
            "max_tokens": st.integers(1, 8) | JSON}).map(
                lambda body: json.dumps(body).encode()))


def openai_error(response: httpx.Response) -> dict[str, Any]:
    """The error of a 4xx answer, checked to be OpenAI's shape with a message that says
    what was wrong (and no traceback)."""
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"].strip(), error
    assert "Traceback" not in error["message"], error
    return dict(error)


# PML schemas and prompts, as a careless or hostile client writes them
TAGS = ["schema", "module", "union", "param", "prompt", "user", "system", "assistant",
        "a", "b", "", "!--", "![CDATA["]
ATTRIBUTES = ['name="a"', 'name="b"', 'len="3"', 'len="-1"', 'len="99999999999"',
              'schema="s"', 'x="&lt;"', 'name=""', "name='a", 'name="a" name="a"']
# Markup-shaped text: tags, attributes, entities and text in any order and nesting.
PIECES = st.sampled_from(TAGS).flatmap(lambda tag: st.sampled_from([
    f"<{tag}>", f"</{tag}>", f"<{tag}/>", *(f"<{tag} {a}>" for a in ATTRIBUTES),
    *(f"<{tag} {a}/>" for a in ATTRIBUTES)])) | st.sampled_from(
    ["&lt;", "&amp;", "&#0;", "&#x110000;", "&bogus;", "]]>", "<!DOCTYPE x>", "\r\n",
     "<?xml version='1.0'?>", "\x00", "\ud800"]) | st.text(max_size=8)
MARKUP = st.lists(PIECES, max_size=30).map("".join)

# Paths for the Fleet gateway: Fleet and Control segments, dot segments and escapes.
SEGMENTS = st.sampled_from(["v1", "fleet", "control", "get-run", "get-fab", "start-run",
                            "list-runs", "..", ".", "", "%2e%2e", "%2E%2e", "%2f", "..%2f",
                            "%67et-run", "push-object", "register-node"])
RAW_PATHS = st.lists(SEGMENTS, min_size=1, max_size=6).map(lambda parts: "/" + "/".join(parts))
