"""Property tests (hypothesis) for what parses untrusted input: PML schemas and prompts, pack
manifests and files, the Fleet gateway's routing and its GetFab rewrite. Whatever the
input, the parser answers with its own error type (which the servers turn into a 4xx) or a
value, never another exception."""

import json
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from meancache.fl_server.fleet_gateway import FLEET_METHODS, attach_signature, fleet_route
from meancache.shared.errors import PackError, PMLError
from meancache.shared.pack import manifest_from_json, read_pack, write_pack
from meancache.shared.pml import SchemaRegistry, parse_prompt, parse_schema, write_schema

FEW = settings(max_examples=150, deadline=None, derandomize=True)
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
JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(
    max_size=10), lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.text(max_size=10), inner, max_size=4), max_leaves=15)
MANIFEST_FIELDS = {"format": st.just("meancache-pack") | JSON, "version": st.just(1) | JSON,
                   "model": st.text(max_size=300) | JSON, "sigma": st.floats() | JSON,
                   "count": st.integers() | JSON, "created": st.text(max_size=70) | JSON,
                   "body_bytes": st.integers() | JSON, "body_sha256": st.text(max_size=70) | JSON,
                   "encoder": st.none() | st.text(max_size=10) | JSON}


@FEW
@given(MARKUP)
def test_schema_parsing_raises_only_pml_errors(source: str) -> None:
    try:
        schema = parse_schema(source)
    except PMLError as exc:
        assert exc.line is None or exc.line >= 1
        return
    assert parse_schema(write_schema(schema)) == schema  # what parses, round-trips


@FEW
@given(MARKUP, st.sampled_from(["<schema name=\"s\"><module name=\"a\">x<param name=\"p\" "
                                "len=\"3\"/></module><union><module name=\"b\"/><module "
                                "name=\"c\"/></union></schema>"]))
def test_prompt_parsing_and_resolving_raise_only_pml_errors(source: str, schema: str) -> None:
    registry = SchemaRegistry()
    registry.add(parse_schema(schema))
    try:
        registry.resolve(parse_prompt(source), lambda text: len(text))
    except PMLError:
        pass


@FEW
@given(st.fixed_dictionaries({}, optional=MANIFEST_FIELDS) | JSON)
def test_a_manifest_is_a_valid_one_or_a_pack_error(data: object) -> None:
    try:
        manifest = manifest_from_json(data, "fuzzed")
    except PackError:
        return
    assert 0 <= manifest.count <= manifest.body_bytes <= 2**40
    assert isinstance(manifest.model, str) and len(manifest.body_sha256) == 64


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.binary(max_size=300), st.integers(0, 400), st.dictionaries(
    st.sampled_from(["body_bytes", "count", "model", "body_sha256"]), JSON, max_size=2))
def test_a_damaged_pack_file_is_refused_with_a_pack_error(
        tmp_path_factory, noise: bytes, cut: int, manifest: dict[str, object]) -> None:
    path = Path(tmp_path_factory.mktemp("pack")) / "p.mcpack"
    write_pack(path, [("what is rice", "a grain"), ("hello", "hi")], "m", 1.0)
    head, body = path.read_bytes().split(b"\n", 1)
    head = json.dumps({**json.loads(head), **manifest}).encode()
    path.write_bytes((head + b"\n" + body)[:cut or None] + noise)
    try:
        pack = read_pack(path)
    except PackError:
        return
    assert pack.manifest.count == len(pack.answers)


SEGMENTS = st.sampled_from(["v1", "fleet", "control", "get-run", "get-fab", "start-run",
                            "list-runs", "..", ".", "", "%2e%2e", "%2E%2e", "%2f", "..%2f",
                            "%67et-run", "push-object", "register-node"])
RAW_PATHS = st.lists(SEGMENTS, min_size=1, max_size=6).map(lambda parts: "/" + "/".join(parts))


@FEW
@given(RAW_PATHS, st.sampled_from(["POST", "GET", "PUT"]), st.sampled_from([b"", b"x=1"]))
def test_the_gateway_routes_exactly_the_fleet_paths(path: str, method: str,
                                                     query: bytes) -> None:
    route = fleet_route({"method": method, "path": path, "raw_path": path.encode(),
                         "query_string": query})
    expected = path in FLEET_METHODS.values() and method == "POST" and not query
    assert route == (path if expected else None)


@FEW
@given(st.binary(max_size=200))
def test_attaching_a_signature_to_any_answer_never_fails(answer: bytes) -> None:
    assert isinstance(attach_signature(answer, Path("/nonexistent")), bytes)
