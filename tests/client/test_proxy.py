"""`meancache proxy` against the official openai SDK: whole and streamed answers, a miss
and then a hit on a paraphrase, feedback and the fresh answer after it, one app's cache
out of another's reach, what goes straight upstream, and its errors (OpenAI-shaped, never
a 500). The upstream is the real server running builtin:tiny (a random-init model that
samples: two answers to one question differ), started once per session; the proxy
stores answers of ANSWER_TOKENS tokens so that a miss costs about a second. The echo
stub stays for what a real server cannot show (the body it was sent) and the scripted
one for its faults (tests/support/servers.py). The encoder is MiniLM. Each test asks
under its own key (``key``), so its cache starts empty whatever ran before it."""

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from meancache.client.config import Settings, load_settings
from meancache.client.pack.store import PACK_FILE
from meancache.client.proxy import partitions
from meancache.client.proxy.apps import key_digest
from meancache.client.proxy.partitions import Partition
from meancache.client.proxy.service import Proxy
from meancache.shared.errors import MeanCacheError
from meancache.shared.pack import write_pack

from meancache.cli import main
from meancache.embedded import start_embedded_upstream
from tests.support.servers import ECHO_MODEL, echo_upstream, scripted_upstream

QUESTION = "How do I bake sourdough bread at home?"
PARAPHRASE = "How can I bake sourdough bread at home?"
MODEL = "builtin:tiny"  # what the real upstream serves
ANSWER_TOKENS = 8  # the answers the proxy stores (and asks the upstream for)


def proxy_settings(data: Path, upstream: str | None, **overrides: Any) -> Settings:
    overrides.setdefault("answer_max_tokens", ANSWER_TOKENS)
    overrides.setdefault("explore_rate", 0.0)  # tests of hits draw no exploration
    return load_settings(data / "config", data / "data", environ={}, encoder_model="minilm",
                         encoder_backend="torch", upstream_url=upstream, **overrides)


@pytest.fixture(scope="module")
def settings(tmp_path_factory: pytest.TempPathFactory, upstream_url: str) -> Settings:
    return proxy_settings(tmp_path_factory.mktemp("proxy"), upstream_url)


@pytest.fixture(scope="module")
def base_url(settings: Settings) -> Iterator[str]:
    proxy = Proxy.open(settings)
    try:
        yield proxy.start()
    finally:
        proxy.close()


@pytest.fixture
def key(request: pytest.FixtureRequest) -> str:
    """An API key of this test's own: its cache namespace is empty when it starts."""
    return "key-" + hashlib.sha256(request.node.nodeid.encode()).hexdigest()[:12]


def client(base_url: str, key: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=base_url, api_key=key, max_retries=0)


def ask(base_url: str, question: str, key: str, model: str = MODEL, **extra: Any
        ) -> tuple[str, str, Any]:
    """(x-meancache header, answer, completion) of one whole answer."""
    raw = client(base_url, key).chat.completions.with_raw_response.create(
        model=model, messages=[{"role": "user", "content": question}], **extra)
    completion = raw.parse()
    return raw.headers["x-meancache"], completion.choices[0].message.content, completion


def test_a_paraphrase_gets_the_cached_answer_with_where_it_came_from(base_url: str,
                                                                     key: str) -> None:
    header, first, completion = ask(base_url, QUESTION, key)
    assert header == "miss"
    assert completion.model == MODEL and completion.choices[0].finish_reason in (
        "stop", "length")
    assert completion.usage.prompt_tokens > 0  # the upstream's own count
    assert 0 < completion.usage.completion_tokens <= ANSWER_TOKENS
    header, second, completion = ask(base_url, PARAPHRASE, key)
    assert second == first
    assert header.startswith("hit; similarity=")
    similarity = float(header.split("similarity=")[1].split(";")[0])
    assert 0.869 <= similarity <= 1.0  # at least MiniLM's tau
    assert "matched=How do I bake sourdough bread at home?" in header
    assert completion.usage.prompt_tokens == 0 and completion.usage.completion_tokens == 0
    assert completion.model_extra["meancache"]["source"] == "cache"
    assert completion.model == MODEL


def test_a_streamed_miss_and_hit_are_well_formed_event_streams(base_url: str,
                                                               key: str) -> None:
    question = "What temperature should a pizza oven reach?"
    texts, headers, ends = [], [], []
    for asked in (question, "What temperature should my pizza oven reach?"):
        with client(base_url, key).chat.completions.with_streaming_response.create(
                model=MODEL, messages=[{"role": "user", "content": asked}], stream=True,
                stream_options={"include_usage": True}) as raw:
            headers.append(raw.headers["x-meancache"])
            chunks = list(raw.parse())
        assert chunks[-1].usage is not None and chunks[-1].choices == []
        ends.append(chunks[-2].choices[0].finish_reason)
        assert len({chunk.id for chunk in chunks}) == 1
        texts.append("".join(c.choices[0].delta.content or "" for c in chunks if c.choices))
    assert headers[0] == "miss" and headers[1].startswith("hit; ")
    assert texts[1] == texts[0] and texts[0]
    assert ends[0] in ("stop", "length") and ends[1] in ("stop", "length")


def test_feedback_marks_a_hit_wrong_and_the_next_ask_gets_the_fresh_answer(
        base_url: str, key: str) -> None:
    question = "How long should I boil an egg?"
    paraphrase = "How long should I boil eggs?"
    _, original, _ = ask(base_url, question, key)
    header, served, completion = ask(base_url, paraphrase, key)
    assert header.startswith("hit") and served == original
    response = httpx.post(f"{base_url}/meancache/feedback", json={"id": completion.id},
                          headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert response.status_code == 200, response.text
    assert response.headers["x-meancache"] == "miss"
    fresh = response.json()["choices"][0]["message"]["content"]
    assert fresh != original  # a new sample from the upstream, not the rejected answer
    assert response.json()["meancache"]["rejected"] is True
    header, again, _ = ask(base_url, paraphrase, key)
    assert header.startswith("hit") and again == fresh  # the corrected answer now
    twice = httpx.post(f"{base_url}/meancache/feedback", json={"id": completion.id},
                       headers={"Authorization": f"Bearer {key}"}, timeout=60)
    assert twice.status_code == 400 and twice.json()["error"]["code"] == "not_rejectable"


def test_a_second_key_never_sees_the_first_keys_entries(base_url: str, settings: Settings,
                                                        key: str) -> None:
    question = "Which grape makes a Barolo wine?"
    other = key + "-other"
    header, first, completion = ask(base_url, question, key)
    assert header == "miss"
    header, _, fresh = ask(base_url, question, other)  # the very same question
    assert header == "miss" and fresh.usage.completion_tokens > 0  # the upstream answered
    stolen = httpx.post(f"{base_url}/meancache/feedback", json={"id": completion.id},
                        headers={"Authorization": f"Bearer {other}"})
    assert stolen.status_code == 404
    assert stolen.json()["error"]["code"] == "response_not_found"
    stored = b"".join(p.read_bytes() for p in (settings.data_dir / "proxy").rglob("*")
                      if p.is_file())
    assert key.encode() not in stored and other.encode() not in stored  # only digests


def test_cache_list_says_which_app_asked(base_url: str, settings: Settings, key: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    raw = client(base_url, key + "-notebook").with_options(
        default_headers={"X-Meancache-App": "notebook"}).chat.completions.with_raw_response
    raw.create(model=MODEL, messages=[{"role": "user", "content": "What is a roux?"}])
    ask(base_url, "What is a béchamel?", key)
    assert main(["--config-dir", str(settings.config_dir), "--data-dir",
                 str(settings.data_dir), "cache", "list", "--json", "--limit", "0"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    asked = {row["query"]: row["asked_by"] for row in rows}
    assert asked["What is a roux?"] == "notebook"
    assert asked["What is a béchamel?"] == key_digest(key)  # no label: the key's digest


def test_a_follow_up_is_looked_up_only_after_turns_the_cache_answered(base_url: str,
                                                                      key: str) -> None:
    first = "What is the capital of Australia?"
    _, answer, _ = ask(base_url, first, key)
    follow_up = [{"role": "user", "content": first}, {"role": "assistant", "content": answer},
                 {"role": "user", "content": "What is its population?"}]
    raw = client(base_url, key).chat.completions.with_raw_response.create(
        model=MODEL, messages=follow_up)
    assert raw.headers["x-meancache"] == "miss"
    follow_up[-1]["content"] = "What's its population?"
    again = client(base_url, key).chat.completions.with_raw_response.create(
        model=MODEL, messages=follow_up)
    assert again.headers["x-meancache"].startswith("hit")
    # the same follow-up after a first turn the cache never gave: straight upstream
    follow_up[1]["content"] = "Canberra, made up by the app"
    other = client(base_url, key).chat.completions.with_raw_response.create(
        model=MODEL, messages=follow_up)
    assert other.headers["x-meancache"] == "bypass; reason=history"
    # and a fresh "What is its population?" never gets the follow-up's answer
    assert ask(base_url, "What is its population?", key)[0] == "miss"


def test_a_system_prompt_has_a_cache_of_its_own(base_url: str, key: str) -> None:
    question = "How do I fold a paper crane?"
    ask(base_url, question, key)
    messages = [{"role": "system", "content": "Answer like a pirate."},
                {"role": "user", "content": question}]
    pirate = client(base_url, key).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages)
    assert pirate.headers["x-meancache"] == "miss"
    again = client(base_url, key).chat.completions.with_raw_response.create(
        model=MODEL, messages=messages)
    assert again.headers["x-meancache"].startswith("hit")
    assert again.parse().choices[0].message.content == \
        pirate.parse().choices[0].message.content


@pytest.mark.parametrize(("extra", "reason"), [
    ({"stop": ["\n"]}, "field-stop"),
    ({"temperature": 0.5, "seed": 3}, "field-seed"),
])
def test_requests_the_cache_cannot_answer_safely_go_straight_upstream(
        base_url: str, key: str, extra: dict[str, Any], reason: str) -> None:
    """The real upstream answers them (never stored: asked again, still a bypass)."""
    assert ask(base_url, QUESTION, key)[0] == "miss"
    for _ in range(2):
        header, _, completion = ask(base_url, QUESTION, key, **extra)
        assert header == f"bypass; reason={reason}"
        assert completion.model == MODEL and completion.usage.completion_tokens > 0


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
    {"n": 2},
])
def test_what_the_upstream_refuses_reaches_the_app_as_its_400(
        base_url: str, key: str, extra: dict[str, Any]) -> None:
    """The real upstream refuses fields it does not serve: the bypassed request gets an
    OpenAI 400 saying the upstream refused it (not a 5xx), and nothing is stored."""
    with pytest.raises(openai.BadRequestError, match="the upstream refused") as bad:
        ask(base_url, QUESTION, key, **extra)
    assert bad.value.body["code"] == "upstream_refused"  # type: ignore[index]
    assert ask(base_url, QUESTION, key)[0] == "miss"


@pytest.mark.parametrize(("extra", "reason"), [
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}]},
     "tools"),
    ({"n": 2}, "n"),
    ({"stop": ["\n"]}, "field-stop"),
])
def test_a_bypassed_request_reaches_the_upstream_as_the_app_sent_it(
        tmp_path: Path, extra: dict[str, Any], reason: str) -> None:
    """What the upstream was sent, field for field: only a recording stub can show it."""
    received: list[dict[str, Any]] = []
    with echo_upstream(received) as upstream:
        proxy = Proxy.open(proxy_settings(tmp_path, upstream))
        try:
            header, answer, _ = ask(proxy.start(), QUESTION, "key", model=ECHO_MODEL, **extra)
        finally:
            proxy.close()
    assert header == f"bypass; reason={reason}"
    assert answer.endswith(QUESTION) and received[-1] == {
        "model": ECHO_MODEL, "messages": [{"role": "user", "content": QUESTION}]} | extra


def test_a_smaller_max_tokens_gets_a_cached_answer_only_where_it_fits(tmp_path: Path) -> None:
    """An app asking for fewer tokens than the proxy's answers (most apps send max_tokens)
    is still answered from the cache where the cached answer is no longer (the echo
    upstream's answers are 3 tokens); a longer one is a miss, and the upstream is asked for
    no more than the app takes (only a recording upstream can show what it was sent)."""
    received: list[dict[str, Any]] = []
    with echo_upstream(received) as upstream:
        proxy = Proxy.open(proxy_settings(tmp_path, upstream))
        try:
            base = proxy.start()
            header, stored, _ = ask(base, QUESTION, "key", model=ECHO_MODEL)
            assert header == "miss" and received[-1]["max_tokens"] == ANSWER_TOKENS
            header, answer, completion = ask(base, QUESTION, "key", model=ECHO_MODEL,
                                             max_tokens=3)
            assert header.startswith("hit; ") and answer == stored
            assert completion.choices[0].finish_reason == "stop"
            header, answer, completion = ask(base, PARAPHRASE, "key", model=ECHO_MODEL,
                                             max_completion_tokens=2)
            assert header == "miss" and answer != stored and len(received) == 2
            assert "longer than the 2 tokens asked for" in \
                completion.model_extra["meancache"]["declined"]
            assert received[-1]["max_tokens"] == 2
        finally:
            proxy.close()


def test_an_answer_a_smaller_max_tokens_cut_short_is_not_stored(base_url: str,
                                                                 key: str) -> None:
    """The real upstream's answer under an app's smaller max_tokens: the app gets it as the
    upstream gave it; the cache keeps it only if it ended on its own (a cut one is shorter
    than the answers the cache serves to others)."""
    question = "Which spices go into a garam masala blend?"
    header, _, completion = ask(base_url, question, key, max_tokens=2)
    assert header == "miss" and completion.usage.completion_tokens <= 2
    ended = completion.choices[0].finish_reason
    header, _, _ = ask(base_url, question, key)
    if ended == "length":  # cut: not stored
        assert header == "miss"
    else:  # it ended on its own within 2 tokens: the answer any asker would get
        assert header.startswith("hit; ")


def test_an_image_goes_upstream_and_its_refusal_comes_back(base_url: str, key: str) -> None:
    """The proxy relays what it cannot cache (an image part); the real text-only upstream
    refuses it, and the app gets that 400 as an OpenAI error."""
    content = [{"type": "text", "text": QUESTION},
               {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]
    with pytest.raises(openai.BadRequestError, match="the upstream refused") as bad:
        client(base_url, key).chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": content}], stream=True)
    assert bad.value.body["code"] == "upstream_refused"  # type: ignore[index]


def test_bad_requests_are_openai_errors_the_sdk_raises(base_url: str, key: str) -> None:
    sdk = client(base_url, key)
    with pytest.raises(openai.BadRequestError) as bad:
        sdk.chat.completions.create(model=MODEL, messages=[])
    assert bad.value.body["param"] == "messages"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError, match="temperature"):
        sdk.chat.completions.create(model=MODEL, temperature=7,
                                    messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError, match="role"):
        sdk.chat.completions.create(model=MODEL,
                                    messages=[{"role": "wizard", "content": "hi"}])
    with pytest.raises(openai.NotFoundError):
        sdk.embeddings.create(model=MODEL, input="hi")
    assert [m.id for m in sdk.models.list()] == [MODEL]


@pytest.mark.parametrize(("send", "status", "code"), [
    ({"content": b"{", "headers": {"Content-Type": "application/json"}}, 400, None),
    ({"content": b'{"model": "echo"}', "headers": {"Content-Type": "text/plain"}}, 415,
     "unsupported_media_type"),
    ({"content": b" " * (5 * 1024 * 1024), "headers": {"Content-Type": "application/json"}},
     413, "request_too_large"),
    ({"content": b"{}", "headers": {"Content-Type": "application/json",
                                    "Host": "evil.example"}}, 400, "host_not_allowed"),
    ({"json": {"model": "echo", "stream": "yes",
               "messages": [{"role": "user", "content": "hi"}]}}, 400, None),
])
def test_what_is_refused_before_parsing_or_by_pydantic(base_url: str, send: dict[str, Any],
                                                       status: int, code: str | None) -> None:
    response = httpx.post(f"{base_url}/chat/completions", **send)
    assert response.status_code == status
    error = response.json()["error"]
    assert error["code"] == code and error["message"]


def test_paths_are_normalised_and_others_refused(base_url: str) -> None:
    root = base_url.removesuffix("/v1")
    assert httpx.get(f"{root}//v1//models/").status_code == 200
    assert httpx.get(f"{root}/v1/secrets").json()["error"]["code"] == "not_found"
    refused = httpx.get(f"{root}/v1/chat/completions")
    assert refused.status_code == 405 and refused.json()["error"]["message"]


@pytest.mark.parametrize(("kind", "extra", "status", "code"), [
    ("busy", {}, 502, "upstream_unavailable"),  # a 503 upstream
    ("bad", {}, 400, "upstream_refused"),  # the upstream's 400, in the proxy's words
    ("plain", {}, 502, "upstream_unavailable"),  # JSON where an event stream was asked for
    ("broken", {"n": 2}, 502, "bad_upstream_answer"),  # relayed: an event stream, not JSON
])
def test_what_an_upstream_answers_is_checked(kind: str, extra: dict[str, Any], status: int,
                                             code: str, tmp_path: Path) -> None:
    with scripted_upstream() as stub:
        proxy = Proxy.open(proxy_settings(tmp_path, f"{stub}/{kind}"))
        try:
            response = httpx.post(f"{proxy.start()}/chat/completions", json={
                "model": "scripted", "messages": [{"role": "user", "content": "hi"}]} | extra)
        finally:
            proxy.close()
    assert response.status_code == status
    assert response.json()["error"]["code"] == code


def test_an_upstream_that_refuses_the_proxys_key_stops_it_at_start(tmp_path: Path) -> None:
    with scripted_upstream() as stub, pytest.raises(MeanCacheError, match="refused the API"):
        Proxy.open(proxy_settings(tmp_path, f"{stub}/locked"))


def test_an_upstream_that_breaks_or_refuses_is_an_error_never_a_500(
        tmp_path: Path) -> None:
    """An upstream that fails mid-stream ("out of memory" in the event stream): a fault
    the real server does not produce on demand, hence the scripted stub."""
    with scripted_upstream() as stub:
        proxy = Proxy.open(proxy_settings(tmp_path, f"{stub}/broken"))
        try:
            sdk = client(proxy.start(), "key-one")
            with pytest.raises(openai.APIStatusError) as failed:
                sdk.chat.completions.create(model="scripted",
                                            messages=[{"role": "user", "content": "hi"}])
            assert failed.value.status_code == 502
            with pytest.raises(openai.APIError, match="the upstream failed mid-answer"):
                list(sdk.chat.completions.create(
                    model="scripted", stream=True,
                    messages=[{"role": "user", "content": "hello there"}]))
            kept = proxy.state.partitions.get(key_digest("key-one"), ())
            assert isinstance(kept, Partition) and len(kept.cache) == 0  # nothing half-made
        finally:
            proxy.close()


def test_configured_apps_are_let_in_by_their_key_only_and_may_share_a_cache(
        tmp_path: Path, upstream_url: str) -> None:
    apps = {"editor": "sk-editor", "notes": "sk-notes"}
    for shared in (False, True):
        proxy = Proxy.open(proxy_settings(tmp_path / str(shared), upstream_url,
                                          proxy_apps=apps, proxy_shared=shared))
        try:
            url = proxy.start()
            with pytest.raises(openai.AuthenticationError):
                ask(url, QUESTION, key="sk-stranger")
            assert ask(url, QUESTION, key="sk-editor")[0] == "miss"
            header = ask(url, QUESTION, key="sk-notes")[0]
            assert header.startswith("hit") if shared else header == "miss"
        finally:
            proxy.close()


def test_the_instruction_pack_answers_first_and_only_without_system_messages(
        tmp_path: Path, upstream_url: str) -> None:
    settings = proxy_settings(tmp_path, upstream_url)
    write_pack(settings.packs_dir / PACK_FILE, [("How do I boil an egg?", "Eight minutes.")],
               model="builtin:tiny", sigma=3.0)
    proxy = Proxy.open(settings)
    try:
        url = proxy.start()
        header, answer, completion = ask(url, "how do I boil an egg", "key-one")
        assert header.startswith("hit; similarity=1.0000") and header.endswith("source=pack")
        assert answer == "Eight minutes."
        pirate = client(url, "key-one").chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "system", "content": "Be a pirate."},
                                   {"role": "user", "content": "How do I boil an egg?"}])
        assert pirate.headers["x-meancache"] == "miss"
        fresh = httpx.post(f"{url}/meancache/feedback", json={"id": completion.id},
                           headers={"Authorization": "Bearer key-one"}, timeout=60)
        assert fresh.status_code == 200
        assert fresh.headers["x-meancache"] == "miss"
        assert fresh.json()["choices"][0]["message"]["content"] != "Eight minutes."
        assert fresh.json()["model"] == MODEL  # the upstream's answer
        assert ask(url, "how do I boil an egg", "key-one")[1] != "Eight minutes."
    finally:
        proxy.close()


def test_past_its_limits_an_app_or_a_system_prompt_goes_straight_upstream(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, upstream_url: str) -> None:
    monkeypatch.setattr(partitions, "MAX_PER_NAMESPACE", 1)
    monkeypatch.setattr(partitions, "MAX_NAMESPACES", 1)
    proxy = Proxy.open(proxy_settings(tmp_path, upstream_url))
    try:
        url = proxy.start()
        assert ask(url, QUESTION, "key-one")[0] == "miss"
        assert ask(url, QUESTION, "key-one")[0].startswith("hit")
        assert ask(url, QUESTION, key="another")[0] == "bypass; reason=apps"
        pirate = client(url, "key-one").chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "system", "content": "Be a pirate."},
                                   {"role": "user", "content": QUESTION}])
        assert pirate.headers["x-meancache"] == "bypass; reason=system-prompts"
    finally:
        proxy.close()


def test_the_proxy_starts_its_embedded_upstream_and_stops_it(tmp_path: Path) -> None:
    """No upstream configured: the proxy starts the embedded server itself (builtin:tiny,
    holding a key made for this run), answers a miss from it and a paraphrase from the
    cache, and stops it when it closes."""
    settings = proxy_settings(tmp_path, None, upstream_model=MODEL)
    settings.data_dir.mkdir(parents=True)  # as `meancache proxy` makes it before this
    proxy = Proxy.open(settings, start_embedded_upstream)
    assert proxy.embedded is not None
    embedded = proxy.embedded.url
    try:
        url = proxy.start()
        header, first, completion = ask(url, QUESTION, "key-one")
        assert header == "miss" and completion.model == MODEL
        assert 0 < completion.usage.completion_tokens <= ANSWER_TOKENS
        header, second, _ = ask(url, PARAPHRASE, "key-one")
        assert header.startswith("hit") and second == first
        assert httpx.get(f"{embedded}/v1/models").status_code == 401  # its own key only
    finally:
        proxy.close()
    with pytest.raises(httpx.ConnectError):
        httpx.get(f"{embedded}/v1/models")
