"""Malformed and hostile requests against the real server (builtin:tiny on loopback): each
gets a 4xx with a JSON error body, never a 500, and the server answers a normal request
afterwards. Slow and dropped clients do not stop it serving others."""

import json
import re
import socket
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from meancache.shared.pml import PML_MEDIA_TYPE
from meancache.upstream.server.app import ServerSettings
from meancache.upstream.server.limits import Limits, parse_json

from tests.support.fuzz import fuzzed
from tests.support.servers import running_upstream

KEY = "hostile-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
JSON = {**AUTH, "Content-Type": "application/json"}
AS_PML = {**AUTH, "Content-Type": PML_MEDIA_TYPE}
LIMITS = Limits(max_prompt_tokens=256, max_tokens=512, max_json_depth=16)
SCHEMA = """<schema name="manual">
  <module name="chapter">How to assemble a bicycle.</module>
  <module name="tool">Use the <param name="name" len="4"/> tool.</module>
  <union><module name="short">Answer briefly.</module><module name="long">In depth.</module>
  </union>
</schema>"""


def user(content: str = "hi") -> list[dict[str, str]]:
    return [{"role": "user", "content": content}]


def body(**fields: object) -> bytes:
    """A chat request with ``fields`` over a valid one-message default."""
    return json.dumps({"messages": user(), "max_tokens": 2, **fields}).encode()


def raw_body(fragment: str) -> bytes:
    """A chat body whose ``content`` is ``fragment`` as written (JSON escapes kept)."""
    return b'{"messages": [{"role": "user", "content": "' + fragment.encode() + b'"}]}'


def pml(prompt: str) -> bytes:
    return body(messages=user(prompt))


@dataclass(frozen=True)
class Case:
    name: str
    status: int
    fragment: str  # in the error message
    content: bytes = b""
    headers: dict[str, str] = field(default_factory=lambda: JSON)
    method: str = "POST"
    path: str = "/v1/chat/completions"


def schema_case(name: str, source: str | bytes, fragment: str, status: int = 400) -> Case:
    content = source.encode() if isinstance(source, str) else source
    return Case(name, status, fragment, content, AS_PML, path="/v1/schemas")


DEEP = b"[" * 5000 + b"]" * 5000
CASES = [
    # bad JSON
    Case("not-json", 400, "not valid JSON", b"{not json"),
    Case("empty-body", 400, "not valid JSON", b""),
    Case("truncated", 400, "not valid JSON", b'{"messages": ['),
    Case("trailing-garbage", 400, "not valid JSON", b'{"messages": []} xyz'),
    Case("invalid-utf8", 400, "not valid JSON", b'{"messages": "\xff\xfe"}'),
    Case("overlong-utf8", 400, "not valid JSON", raw_body("\\/").replace(b"\\/", b"\xc0\xaf")),
    Case("utf8-encoded-surrogate", 400, "surrogate",
         raw_body("x").replace(b'"x"', b'"\xed\xa0\x80"')),
    Case("array-body", 400, "JSON object", b"[]"),
    Case("string-body", 400, "JSON object", b'"hello"'),
    Case("null-body", 400, "JSON object", b"null"),
    Case("nested-5000-arrays", 400, "nests", DEEP),
    Case("nested-5000-in-field", 400, "nests", b'{"messages": ' + DEEP + b"}"),
    Case("nested-20-objects", 400, "nests", b'{"a":' * 20 + b"1" + b"}" * 20),
    Case("nan", 400, "NaN", body().replace(b'"max_tokens": 2', b'"temperature": NaN')),
    Case("infinity", 400, "Infinity", body().replace(b'"max_tokens": 2', b'"top_p": -Infinity')),
    Case("float-overflow", 400, "out of range", body().replace(b"2}", b"2, \"top_p\": 1e999}")),
    # wrong types and values
    Case("messages-string", 400, "'messages'", body(messages="hi")),
    Case("messages-empty", 400, "'messages'", body(messages=[])),
    Case("messages-null", 400, "'messages'", body(messages=None)),
    Case("message-not-object", 400, "messages[0]", body(messages=["hi"])),
    Case("role-missing", 400, "'role'", body(messages=[{"content": "hi"}])),
    Case("role-unknown", 400, "'role'", body(messages=[{"role": "robot", "content": "x"}])),
    Case("role-number", 400, "'role'", body(messages=[{"role": 1, "content": "x"}])),
    Case("content-number", 400, "content", body(messages=[{"role": "user", "content": 5}])),
    Case("content-null", 400, "content", body(messages=[{"role": "user", "content": None}])),
    Case("content-image", 400, "text parts",
         body(messages=[{"role": "user", "content": [{"type": "image_url"}]}])),
    Case("content-parts-not-objects", 400, "text parts",
         body(messages=[{"role": "user", "content": ["a", "b"]}])),
    Case("temperature-string", 400, "'temperature'", body(temperature="hot")),
    Case("temperature-bool", 400, "'temperature'", body(temperature=True)),
    Case("temperature-negative", 400, "temperature", body(temperature=-1)),
    Case("temperature-high", 400, "temperature", body(temperature=3)),
    Case("top-p-zero", 400, "top_p", body(top_p=0)),
    Case("top-p-two", 400, "top_p", body(top_p=2)),
    Case("max-tokens-zero", 400, "max_tokens", body(max_tokens=0)),
    Case("max-tokens-negative", 400, "max_tokens", body(max_tokens=-5)),
    Case("max-tokens-fraction", 400, "max_tokens", body(max_tokens=1.5)),
    Case("max-tokens-string", 400, "max_tokens", body(max_tokens="10")),
    Case("max-tokens-5000-digits", 400, "digits",
         body().replace(b'"max_tokens": 2', b'"max_tokens": ' + b"9" * 5000)),
    Case("max-tokens-over-limit", 400, "at most 512", body(max_tokens=10**6)),
    Case("max-completion-tokens-over-limit", 400, "at most 512",
         body(max_completion_tokens=100_000)),
    Case("seed-overflow", 400, "seed", body(seed=2**64)),
    Case("seed-negative", 400, "seed", body(seed=-1)),
    Case("seed-5000-digits", 400, "digits",
         body().replace(b'"max_tokens": 2', b'"seed": ' + b"1" * 5000)),
    Case("seed-string", 400, "seed", body(seed="7")),
    Case("temperature-5-digit-exponent", 400, "exponent",
         body().replace(b'"max_tokens": 2', b'"temperature": 1e-00001')),
    Case("temperature-24-digits", 400, "24 digits",
         body().replace(b'"max_tokens": 2', b'"temperature": 0.' + b"1" * 23)),
    Case("stop-number", 400, "'stop'", body(stop=5)),
    Case("stop-list-of-numbers", 400, "'stop'", body(stop=[1, 2])),
    Case("stop-five-strings", 400, "stop", body(stop=["a", "b", "c", "d", "e"])),
    Case("stop-empty-string", 400, "stop", body(stop=[""])),
    Case("stop-too-long", 400, "stop string", body(stop=["x" * 1000])),
    # unicode edge cases
    Case("lone-high-surrogate", 400, "surrogate", raw_body("\\ud800")),
    Case("lone-low-surrogate", 400, "surrogate", raw_body("a\\udfffb")),
    Case("reversed-surrogate-pair", 400, "surrogate", raw_body("\\udc00\\ud800")),
    Case("surrogate-in-key", 400, "surrogate",
         b'{"\\ud800": 1, "messages": [{"role": "user", "content": "hi"}]}'),
    Case("surrogate-in-stop", 400, "surrogate", body().replace(b"2}", b'2, "stop": "\\udbff"}')),
    # oversize
    Case("body-over-limit", 413, "bytes", body(messages=user("x" * 70_000))),
    Case("prompt-over-token-limit", 400, "at most 256", body(messages=user("hello " * 400))),
    # media types (a web page may post these to any address without asking)
    Case("text-plain", 415, "application/json", body(), {**AUTH, "Content-Type": "text/plain"}),
    Case("no-content-type", 415, "application/json", body(), AUTH),
    Case("form-post", 415, "application/json", b"messages=hi",
         {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}),
    Case("multipart", 415, "application/json", body(),
         {**AUTH, "Content-Type": "multipart/form-data; boundary=x"}),
    Case("json-lookalike", 415, "application/json", body(),
         {**AUTH, "Content-Type": "application/json-patch+json"}),
    Case("schema-as-text-plain", 415, PML_MEDIA_TYPE, SCHEMA.encode(),
         {**AUTH, "Content-Type": "text/plain"}, path="/v1/schemas"),
    Case("pml-type-on-chat", 415, "application/json", body(), AS_PML),
    # header abuse
    Case("no-key", 401, "API key", body(), {"Content-Type": "application/json"}),
    Case("wrong-key", 401, "API key", body(),
         {"Authorization": "Bearer nope", "Content-Type": "application/json"}),
    Case("basic-auth", 401, "API key", body(),
         {"Authorization": f"Basic {KEY}", "Content-Type": "application/json"}),
    Case("huge-key", 401, "API key", body(),
         {"Authorization": "Bearer " + "k" * 8000, "Content-Type": "application/json"}),
    Case("key-as-prefix", 401, "API key", body(),
         {"Authorization": f"Bearer {KEY}x", "Content-Type": "application/json"}),
    Case("rebinding-host", 400, "Host", body(), {**JSON, "Host": "evil.example"}),
    Case("lookalike-host", 400, "Host", body(), {**JSON, "Host": "localhost.evil.example:80"}),
    Case("rebinding-host-on-get", 400, "Host", method="GET", path="/v1/models",
         headers={**AUTH, "Host": "attacker.test"}),
    Case("wrong-method", 405, "not allowed", method="GET", headers=AUTH),
    Case("no-route", 404, "no route", body(), path="/v1/completions"),
    # bad PML: every PMLError class the API can meet
    schema_case("pml-syntax", '<schema name="x"><module name="m">open</schema>', "line 1"),
    schema_case("pml-len-5000-digits",
                '<schema name="x"><module name="m"><param name="p" len="' + "9" * 5000
                + '"/></module></schema>', "at most 9 digits"),
    schema_case("pml-param-past-context",
                '<schema name="x"><module name="m"><param name="p" len="999999999"/></module>'
                "</schema>", "context"),
    schema_case("pml-doctype",
                '<!DOCTYPE s [<!ENTITY a "aaaa">]><schema name="x"><module name="m">&a;'
                "</module></schema>", "DOCTYPE"),
    schema_case("pml-misplaced-param",
                '<schema name="x"><param name="p" len="3"/></schema>', "outside a module"),
    schema_case("pml-not-utf8", b'<schema name="x"><module name="m">\xff</module></schema>',
                "UTF-8"),
    Case("schema-json-not-string", 400, "schema", b'{"schema": 5}', JSON, path="/v1/schemas"),
    Case("schema-json-surrogate", 400, "surrogate", b'{"schema": "<schema name=\\"\\ud800\\"/>"}',
         JSON, path="/v1/schemas"),
    Case("pml-unknown-schema", 404, "schema_not_found",
         pml('<prompt schema="nothing"><user>hi</user></prompt>')),
    Case("pml-unknown-module", 400, "unknown module",
         pml('<prompt schema="manual"><nope/><user>hi</user></prompt>')),
    Case("pml-union-conflict", 400, "union",
         pml('<prompt schema="manual"><short/><long/><user>hi</user></prompt>')),
    Case("pml-argument-too-long", 400, "tokens",
         pml('<prompt schema="manual"><tool name="' + "spanner " * 40
             + '"/><user>hi</user></prompt>')),
    Case("pml-duplicate-import", 400, "imported twice",
         pml('<prompt schema="manual"><chapter/><chapter/><user>hi</user></prompt>')),
    Case("pml-prompt-syntax", 400, "line 1", pml('<prompt schema="manual"><user>hi</prompt>')),
    Case("pml-misplaced-text", 400, "text inside import",
         pml('<prompt schema="manual"><chapter>text</chapter><user>hi</user></prompt>')),
    Case("delete-unknown-schema", 404, "unknown schema", method="DELETE",
         path="/v1/schemas/absent", headers=AUTH),
    Case("get-unknown-schema", 404, "unknown schema", method="GET", path="/v1/schemas/absent",
         headers=AUTH),
]


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    settings = ServerSettings(api_key=KEY, max_body_bytes=64 * 1024, limits=LIMITS)
    with running_upstream(settings=settings) as url:
        created = httpx.post(f"{url}/v1/schemas", content=SCHEMA, headers=AS_PML, timeout=60)
        assert created.status_code == 201, created.text
        yield url


def normal_chat(base_url: str) -> None:
    response = httpx.post(f"{base_url}/v1/chat/completions", content=body(), headers=JSON,
                          timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] >= 1


@fuzzed()
@given(value=st.floats(allow_nan=False, allow_infinity=False))
def test_every_finite_double_as_json_writes_it_passes_the_number_cap(value: float) -> None:
    """The cap on a number's digits refuses long runs of digits, never a valid double:
    2.2250738585072014e-308 (23 characters, 17 digits) was refused as "23 characters",
    so a fuzzed temperature the proxy relayed got a 400 (MEANCACHE_FUZZ_SEED=3457099220);
    0.00010042926364857862 (Python's shortest form: 21 digits) was refused at 20 digits."""
    assert parse_json(json.dumps({"temperature": value}).encode(), Limits()) == {
        "temperature": value}


@pytest.mark.parametrize("written", [
    "0.0000012345678901234567",  # JavaScript's fixed notation down to 1e-6: 23 digits
    "123456789012345680000",  # and up to 1e21: 21 digits
    "-0.00010042926364857862",  # Python's down to 1e-4: 21 digits
    "2.2250738585072014e-308",  # the smallest normal double: 17 digits, e-308
])
def test_the_longest_forms_json_writers_give_a_double_pass_the_number_cap(
        written: str) -> None:
    assert parse_json(f'{{"temperature": {written}}}'.encode(), Limits()) == {
        "temperature": json.loads(written)}


def test_the_table_holds_at_least_60_distinct_cases() -> None:
    assert len({case.name for case in CASES}) == len(CASES) >= 60


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_a_hostile_request_gets_a_json_4xx(base_url: str, case: Case) -> None:
    response = httpx.request(case.method, base_url + case.path, content=case.content or None,
                             headers=case.headers, timeout=60)
    assert response.status_code == case.status, response.text
    error = response.json()["error"]
    assert case.fragment.lower() in (error["message"] + str(error["code"])).lower()
    normal_chat(base_url)


def http(base_url: str, request: bytes, timeout: float = 10) -> tuple[int, dict]:
    """Send ``request`` on a raw socket (for what httpx will not send); the status and
    the JSON body of the answer."""
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as sock:
        sock.sendall(request)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(payload)


def test_http_1_0_without_a_host_header_is_refused(base_url: str) -> None:
    status, answer = http(base_url, b"GET /v1/models HTTP/1.0\r\n"
                          + f"Authorization: Bearer {KEY}\r\n\r\n".encode())
    assert status == 400 and "Host" in answer["error"]["message"]
    normal_chat(base_url)


def test_a_declared_length_over_the_limit_is_refused_before_the_body(base_url: str) -> None:
    status, answer = http(base_url, b"POST /v1/chat/completions HTTP/1.1\r\n"
                          b"Host: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          + f"Authorization: Bearer {KEY}\r\n".encode()
                          + b"Content-Length: 1000000000\r\nConnection: close\r\n\r\n{")
    assert status == 413 and answer["error"]["code"] == "request_too_large"
    normal_chat(base_url)


def test_a_slow_client_does_not_hold_up_others(base_url: str) -> None:
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as slow:
        slow.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 500\r\n"
                     + f"Authorization: Bearer {KEY}\r\n\r\n".encode() + b'{"mess')
        start = time.monotonic()
        normal_chat(base_url)  # served while the slow body is still arriving
        assert time.monotonic() - start < 30


@pytest.mark.parametrize("sent", [
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n",  # mid-headers
    b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json"
    b"\r\nContent-Length: 200\r\n" + f"Authorization: Bearer {KEY}\r\n\r\n".encode()
    + b'{"messages": [',  # mid-body
], ids=["mid-headers", "mid-body"])
def test_a_client_dropping_mid_request_leaves_the_server_serving(base_url: str,
                                                                 sent: bytes) -> None:
    port = int(base_url.rsplit(":", 1)[1])
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(sent)
    normal_chat(base_url)


def test_a_client_dropping_mid_stream_stops_its_generation(base_url: str) -> None:
    def cancelled() -> float:
        metrics = httpx.get(f"{base_url}/metrics", headers=AUTH, timeout=60).text
        return sum(float(line.split()[1]) for line in metrics.splitlines()
                   if line.startswith("meancache_upstream_cancelled_total"))

    before = cancelled()
    # Greedy, unguarded, and checked to run to its token cap: only a cancel can end it early.
    long = {"max_tokens": 300, "temperature": 0, "repetition_penalty": 1,
            "dry_multiplier": 0, "stop_on_loops": False}
    whole = httpx.post(f"{base_url}/v1/chat/completions", headers=JSON, timeout=120,
                       content=body(**long)).json()
    assert whole["choices"][0]["finish_reason"] == "length", whole
    with httpx.stream("POST", f"{base_url}/v1/chat/completions", headers=JSON, timeout=60,
                      content=body(stream=True, **long)) as response:
        assert response.status_code == 200
        next(response.iter_lines())
    normal_chat(base_url)
    deadline = time.monotonic() + 60
    while cancelled() <= before:
        assert time.monotonic() < deadline, "the dropped stream's generation never stopped"
        time.sleep(0.05)


def requests_by_status(base_url: str) -> Counter[str]:
    """The server's own count of answered requests, by status (its /metrics)."""
    metrics = httpx.get(f"{base_url}/metrics", headers=AUTH, timeout=60).text
    counted: Counter[str] = Counter()
    for line in metrics.splitlines():
        if line.startswith("meancache_upstream_requests_total{"):
            status = re.search(r'status="(\d+)"', line)
            assert status is not None, line
            counted[status[1]] += int(float(line.split()[-1]))
    return counted


def test_the_server_counts_each_hostile_request_with_its_own_4xx(base_url: str) -> None:
    """The whole table sent here (whatever ran before): the server's own count grows by
    exactly the table's statuses, none of them a 5xx (the metrics requests add 200s; a
    path with no route is not counted, so that clients cannot grow the metrics)."""
    before = requests_by_status(base_url)
    for case in CASES:
        httpx.request(case.method, base_url + case.path, content=case.content or None,
                      headers=case.headers, timeout=60)
    grown = requests_by_status(base_url) - before
    grown.pop("200", None)
    assert grown == Counter(str(case.status) for case in CASES if case.name != "no-route")
