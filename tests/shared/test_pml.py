"""PML (Prompt Cache's Prompt Markup Language): parsing, positions, errors, validation,
writing."""

import dataclasses
import pickle
from collections.abc import Callable

import pytest
from meancache.shared.errors import MeanCacheError
from meancache.shared.pml import (
    RESERVED_NAMES,
    ArgumentTooLongError,
    DuplicateImportError,
    DuplicateSchemaError,
    Import,
    MisplacedContentError,
    Module,
    Param,
    PMLError,
    PMLSyntaxError,
    Position,
    Prompt,
    Role,
    Schema,
    SchemaRegistry,
    Text,
    Union,
    UnionConflictError,
    UnknownModuleError,
    UnknownSchemaError,
    is_prompt,
    parse_prompt,
    parse_schema,
    validate_prompt,
    write_prompt,
    write_schema,
)
from meancache.shared.pml.model import UNPLACED

SCHEMA = """\
<schema name="travel">
  <system>You are a helpful travel assistant.</system>
  <module name="city-info">
    Information about <param name="city" len="8"/> follows.
    <module name="city-history">A long history text...</module>
  </module>
  <union>
    <module name="plan-short">Plan a short trip.</module>
    <module name="plan-long">Plan a long trip.</module>
  </union>
  <user>Text outside modules is always included.</user>
</schema>"""

PROMPT = """\
<prompt schema="travel">
  <city-info city="Paris"><city-history/></city-info>
  <plan-short/>
  <user>What should I see first?</user>
  Any free text here too.
</prompt>"""


def words(text: str) -> int:
    return len(text.split())


@pytest.fixture(scope="module")
def schema() -> Schema:
    return parse_schema(SCHEMA)


def P(line: int, column: int) -> Position:  # noqa: N802 - reads like the dataclass
    return Position(line, column)


def raises_at(
    cls: type[PMLError], line: int, column: int, *fragments: str
) -> Callable[[Callable[[], object]], PMLError]:
    """Run a thunk; assert it raises exactly ``cls`` at (line, column) naming ``fragments``."""

    def check(thunk: Callable[[], object]) -> PMLError:
        with pytest.raises(PMLError) as info:
            thunk()
        err = info.value
        assert type(err) is cls, f"{type(err).__name__}: {err}"
        assert (err.line, err.column) == (line, column), str(err)
        message = str(err)
        assert message.startswith(f"line {line}, column {column}: "), message
        for fragment in fragments:
            assert fragment in message, message
        return err

    return check


def schema_error(src: str, cls: type[PMLError], line: int, column: int, *fragments: str) -> None:
    raises_at(cls, line, column, *fragments)(lambda: parse_schema(src))


def prompt_error(src: str, cls: type[PMLError], line: int, column: int, *fragments: str) -> None:
    raises_at(cls, line, column, *fragments)(lambda: parse_prompt(src))


def validation_error(
    src: str,
    schema: Schema,
    cls: type[PMLError],
    line: int,
    column: int,
    *fragments: str,
    count_tokens: Callable[[str], int] | None = None,
) -> None:
    prompt = parse_prompt(src)
    raises_at(cls, line, column, *fragments)(lambda: validate_prompt(prompt, schema, count_tokens))


# --- parsing the paper-style examples --------------------------------------------------


def test_schema_example_parses_to_the_exact_tree(schema: Schema) -> None:
    history = Module("city-history", (Text("A long history text...", P(5, 33)),), P(5, 5))
    city = Module(
        "city-info",
        (
            Text("\n    Information about ", P(3, 28)),
            Param("city", 8, P(4, 23)),
            Text(" follows.\n    ", P(4, 51)),
            history,
        ),
        P(3, 3),
    )
    union = Union(
        (
            Module("plan-short", (Text("Plan a short trip.", P(8, 31)),), P(8, 5)),
            Module("plan-long", (Text("Plan a long trip.", P(9, 30)),), P(9, 5)),
        ),
        P(7, 3),
    )
    expected = Schema(
        "travel",
        (
            Role("system", (Text("You are a helpful travel assistant.", P(2, 11)),), P(2, 3)),
            city,
            union,
            Role("user", (Text("Text outside modules is always included.", P(11, 9)),), P(11, 3)),
        ),
        P(1, 1),
    )
    assert schema == expected


def test_prompt_example_parses_to_the_exact_tree() -> None:
    expected = Prompt(
        "travel",
        (
            Import(
                "city-info",
                {"city": "Paris"},
                (Import("city-history", {}, (), P(2, 27)),),
                P(2, 3),
            ),
            Import("plan-short", {}, (), P(3, 3)),
            Role("user", (Text("What should I see first?", P(4, 9)),), P(4, 3)),
            Text("\n  Any free text here too.\n", P(4, 40)),
        ),
        P(1, 1),
    )
    assert parse_prompt(PROMPT) == expected


def test_example_prompt_validates_against_example_schema(schema: Schema) -> None:
    validate_prompt(parse_prompt(PROMPT), schema, words)
    validate_prompt(parse_prompt(PROMPT), schema)


def test_modules_lists_nested_modules_in_document_order(schema: Schema) -> None:
    modules = schema.modules()
    assert list(modules) == ["city-info", "city-history", "plan-short", "plan-long"]
    assert modules["city-history"].children == (Text("A long history text...", P(5, 33)),)
    assert schema.module("plan-long") is modules["plan-long"]
    assert schema.module("nope") is None
    modules.clear()  # a copy: the schema's index is untouched
    assert len(schema.modules()) == 4


def test_parent_of_and_union_of(schema: Schema) -> None:
    assert schema.parent_of("city-history") == "city-info"
    assert schema.parent_of("city-info") is None
    assert schema.parent_of("plan-short") is None
    assert schema.parent_of("unknown") is None
    union = schema.union_of("plan-long")
    assert union is not None and union.names() == ("plan-short", "plan-long")
    assert schema.union_of("plan-short") is union
    assert schema.union_of("city-info") is None


def test_parent_of_sees_through_roles_and_unions() -> None:
    schema = parse_schema(
        '<schema name="s"><module name="outer"><user><module name="in-role"/></user>'
        '<union><module name="opt-a"/><module name="opt-b"><module name="deep"/></module>'
        "</union></module></schema>"
    )
    assert schema.parent_of("in-role") == "outer"
    assert schema.parent_of("opt-a") == "outer"
    assert schema.parent_of("deep") == "opt-b"
    assert schema.union_of("deep") is None
    assert schema.union_of("opt-b") == schema.union_of("opt-a")


def test_module_params_are_its_own_including_those_in_roles() -> None:
    schema = parse_schema(
        '<schema name="s"><module name="m"><param name="a" len="2"/>'
        '<assistant><param name="b" len="3"/></assistant>'
        '<module name="sub"><param name="c" len="4"/></module></module></schema>'
    )
    modules = schema.modules()
    assert {n: p.length for n, p in modules["m"].params().items()} == {"a": 2, "b": 3}
    assert list(modules["sub"].params()) == ["c"]


def test_roles_wrap_text_params_and_modules() -> None:
    schema = parse_schema(
        '<schema name="s"><user>Ask: <module name="q">about <param name="x" len="5"/>'
        "</module></user></schema>"
    )
    (role,) = schema.children
    assert isinstance(role, Role) and role.role == "user"
    text, module = role.children
    assert text == Text("Ask: ", P(1, 24))
    assert isinstance(module, Module) and module.name == "q"
    assert module.children[1] == Param("x", 5, P(1, 52))


def test_model_is_frozen_and_hashable(schema: Schema) -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        schema.name = "other"  # type: ignore[misc]
    assert hash(schema) == hash(parse_schema(SCHEMA))
    assert hash(parse_prompt(PROMPT)) == hash(parse_prompt(PROMPT))


# --- text rules ---------------------------------------------------------------------------


def test_whitespace_only_text_is_dropped_other_text_kept_verbatim() -> None:
    schema = parse_schema(
        '<schema name="s">\n\t  <module name="m">  <param name="p" len="1"/>  \n  </module>\n'
        "  keep  me \n</schema>"
    )
    module, text = schema.children
    assert isinstance(module, Module)
    assert module.children == (Param("p", 1, P(2, 23)),)  # a tab is one column
    assert text == Text("\n  keep  me \n", P(3, 12))


def test_whitespace_rule_applies_to_prompts() -> None:
    prompt = parse_prompt('<prompt schema="s">\n  <a/>\n  <user>  hi  </user>\n\n</prompt>')
    assert [type(child) for child in prompt.children] == [Import, Role]
    role = prompt.children[1]
    assert isinstance(role, Role) and role.children == (Text("  hi  ", P(3, 9)),)


def test_cdata_keeps_whitespace_only_text() -> None:
    schema = parse_schema('<schema name="s"><module name="m"><![CDATA[ ]]></module></schema>')
    assert schema.modules()["m"].children == (Text(" ", P(1, 35)),)


def test_entities_are_resolved() -> None:
    schema = parse_schema(
        '<schema name="s">if a &lt; b &amp;&amp; c &gt; d: &quot;x&apos;s&quot;&#10;&#x41;</schema>'
    )
    assert schema.children == (Text('if a < b && c > d: "x\'s"\nA', P(1, 18)),)


def test_cdata_merges_with_surrounding_text_into_one_node() -> None:
    schema = parse_schema(
        '<schema name="s">\n  <user>code: <![CDATA[if (a < b && c) { x = "<y>"; }]]> done'
        "<!-- dropped --> !</user>\n</schema>"
    )
    (role,) = schema.children
    assert isinstance(role, Role)
    assert role.children == (Text('code: if (a < b && c) { x = "<y>"; } done !', P(2, 9)),)


def test_text_starting_with_cdata_is_positioned_at_the_cdata_section() -> None:
    schema = parse_schema('<schema name="s">\n<![CDATA[<b>]]></schema>')
    assert schema.children == (Text("\n<b>", P(1, 18)),)
    schema = parse_schema('<schema name="s"><![CDATA[<b>]]></schema>')
    assert schema.children == (Text("<b>", P(1, 18)),)


def test_entities_in_arguments_and_attribute_normalisation() -> None:
    prompt = parse_prompt(
        '<prompt schema="s"><m a="x &lt; y &amp; z" b="1\n2" c="1&#10;2"/></prompt>'
    )
    (imp,) = prompt.children
    assert isinstance(imp, Import)
    assert imp.args == {"a": "x < y & z", "b": "1 2", "c": "1\n2"}


def test_crlf_line_ends_are_normalised_and_lines_counted() -> None:
    schema = parse_schema('<schema name="s">\r\n<module name="m">a\r\nb</module>\r\n</schema>')
    module = schema.modules()["m"]
    assert module.pos == P(2, 1)
    assert module.children == (Text("a\nb", P(2, 18)),)


def test_columns_count_characters_not_bytes() -> None:
    schema = parse_schema('<schema name="s">héllo 😀 <module name="m"/></schema>')
    assert schema.modules()["m"].pos == P(1, 26)


def test_xml_declaration_and_comments_are_accepted() -> None:
    schema = parse_schema('<?xml version="1.0"?>\n<!-- c -->\n<schema name="s"><!-- x --></schema>')
    assert schema == Schema("s", (), P(3, 1))


def test_prompt_keeps_text_roles_and_imports_in_order() -> None:
    prompt = parse_prompt(
        '<prompt schema="s">first <a/> middle <system>sys</system><b x="1"/>'
        "<assistant>ok</assistant> last</prompt>"
    )
    summary = [
        (type(c).__name__, c.text if isinstance(c, Text) else getattr(c, "name", None))
        for c in prompt.children
    ]
    assert summary == [
        ("Text", "first "),
        ("Import", "a"),
        ("Text", " middle "),
        ("Role", None),
        ("Import", "b"),
        ("Role", None),
        ("Text", " last"),
    ]
    roles = [c for c in prompt.children if isinstance(c, Role)]
    assert [(r.role, r.children[0].text) for r in roles] == [("system", "sys"), ("assistant", "ok")]
    assert [i.name for i in prompt.imports()] == ["a", "b"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('<prompt schema="x"/>', True),
        ("  \n\t<prompt schema='x'>hi</prompt>", True),
        ("<prompt>", True),
        ("<prompt/>", True),
        ("<prompts/>", False),
        ('<schema name="x"/>', False),
        ("What is <prompt>?", False),
        ("", False),
        ("prompt", False),
    ],
)
def test_is_prompt(text: str, expected: bool) -> None:
    assert is_prompt(text) is expected


# --- syntax errors -----------------------------------------------------------------------


def test_error_tree_roots_at_meancache_error() -> None:
    for cls in (
        PMLSyntaxError,
        UnknownSchemaError,
        UnknownModuleError,
        UnionConflictError,
        ArgumentTooLongError,
        DuplicateImportError,
        DuplicateSchemaError,
        MisplacedContentError,
    ):
        assert issubclass(cls, PMLError)
    assert issubclass(PMLError, MeanCacheError)
    assert issubclass(UnknownSchemaError, LookupError)


def test_errors_survive_pickling() -> None:
    err = UnknownModuleError("unknown module 'x'", 3, 5)
    copy = pickle.loads(pickle.dumps(err))
    assert type(copy) is UnknownModuleError
    assert (copy.line, copy.column, copy.reason, str(copy)) == (
        3,
        5,
        "unknown module 'x'",
        "line 3, column 5: unknown module 'x'",
    )


def test_mismatched_tag_points_at_the_end_tag() -> None:
    schema_error(
        '<schema name="t">\n  <module name="a">\n</schema>',
        PMLSyntaxError,
        3,
        1,
        "mismatched tag",
        "</module>",
        "line 2, column 3",
    )


def test_unclosed_tag_points_at_the_open_tag() -> None:
    schema_error(
        '<schema name="t">\n  <module name="a">\n  text',
        PMLSyntaxError,
        2,
        3,
        "unclosed tag <module>",
    )


@pytest.mark.parametrize("bad", ["a & b", "a < b"])
def test_bare_special_characters_are_syntax_errors(bad: str) -> None:
    # expat reports the character just after the offending one.
    schema_error(f'<schema name="t">\n  {bad}\n</schema>', PMLSyntaxError, 2, 6, "&lt;", "CDATA")


def test_undefined_entity() -> None:
    schema_error(
        '<schema name="t">\n  a &nbsp; b\n</schema>', PMLSyntaxError, 2, 5, "undefined entity"
    )


def test_empty_document() -> None:
    schema_error("", PMLSyntaxError, 1, 1, "no element found")
    schema_error("  \n", PMLSyntaxError, 2, 1, "no element found")


def test_doctype_is_rejected() -> None:
    with pytest.raises(PMLSyntaxError, match="DOCTYPE") as info:
        parse_schema('<!DOCTYPE schema [<!ENTITY x "y">]>\n<schema name="t">&x;</schema>')
    assert info.value.line == 1


def test_unknown_tag_in_schema() -> None:
    schema_error(
        '<schema name="t">\n  <module name="m"><moduel name="x"/></module></schema>',
        PMLSyntaxError,
        2,
        20,
        "unknown tag <moduel>",
    )


def test_wrong_root_elements() -> None:
    schema_error('<prompt schema="t"/>', PMLSyntaxError, 1, 1, "expected <schema>", "<prompt>")
    prompt_error('\n<schema name="t"/>', PMLSyntaxError, 2, 1, "expected <prompt>", "<schema>")
    schema_error(
        '<schema name="t"><schema name="u"/></schema>', PMLSyntaxError, 1, 18, "root element"
    )


@pytest.mark.parametrize(
    ("tag", "fragment"),
    [
        ('<schema name="t"><module name="m"><param name="p"/></module></schema>', "'len'"),
        ('<schema name="t"><module name="m"><param len="3"/></module></schema>', "'name'"),
        ('<schema name="t"><module><param name="p" len="3"/></module></schema>', "'name'"),
    ],
)
def test_missing_attributes(tag: str, fragment: str) -> None:
    with pytest.raises(PMLSyntaxError, match="missing") as info:
        parse_schema(tag)
    assert fragment in str(info.value)
    assert info.value.line == 1 and info.value.column in (18, 35)


def test_missing_schema_name_and_prompt_schema() -> None:
    schema_error("<schema>\n</schema>", PMLSyntaxError, 1, 1, "<schema> is missing", "'name'")
    prompt_error("<prompt></prompt>", PMLSyntaxError, 1, 1, "<prompt> is missing", "'schema'")
    prompt_error('<prompt schema=" "/>', PMLSyntaxError, 1, 1, "empty schema")


@pytest.mark.parametrize("length", ["0", "-1", "abc", "2.5", "", " 3", "+3", "٣"])
def test_param_len_must_be_a_positive_integer(length: str) -> None:
    schema_error(
        f'<schema name="t">\n <module name="m">\n  <param name="p" len="{length}"/></module>'
        "</schema>",
        PMLSyntaxError,
        3,
        3,
        f"invalid len '{length}'",
        "positive integer",
    )


def test_param_with_content_is_rejected() -> None:
    schema_error(
        '<schema name="t"><module name="m"><param name="p" len="2">x</param></module></schema>',
        PMLSyntaxError,
        1,
        35,
        "must be empty",
    )
    # Whitespace inside is harmless.
    parse_schema(
        '<schema name="t"><module name="m"><param name="p" len="2"> </param></module></schema>'
    )


def test_duplicate_param_in_one_module() -> None:
    schema_error(
        '<schema name="t"><module name="m"><param name="p" len="2"/>\n'
        '<user><param name="p" len="3"/></user></module></schema>',
        PMLSyntaxError,
        2,
        7,
        "duplicate parameter 'p'",
        "module 'm'",
        "line 1, column 35",
    )


def test_same_param_name_in_different_modules_is_fine() -> None:
    schema = parse_schema(
        '<schema name="t"><module name="a"><param name="p" len="2"/>'
        '<module name="b"><param name="p" len="3"/></module></module></schema>'
    )
    assert schema.modules()["b"].params()["p"].length == 3


def test_duplicate_module_name_even_when_nested() -> None:
    schema_error(
        '<schema name="t">\n  <module name="a">\n    <module name="a"/>\n  </module>\n</schema>',
        PMLSyntaxError,
        3,
        5,
        "duplicate module name 'a'",
        "line 2, column 3",
    )


@pytest.mark.parametrize("name", sorted(RESERVED_NAMES))
def test_module_name_may_not_be_a_reserved_tag(name: str) -> None:
    assert {"schema", "module", "param", "union", "prompt", "system", "user", "assistant"} == set(
        RESERVED_NAMES
    )
    schema_error(
        f'<schema name="t">\n  <module name="{name}"/></schema>',
        PMLSyntaxError,
        2,
        3,
        f"module name '{name}'",
        "reserved",
    )


@pytest.mark.parametrize("name", ["1st", "a b", "", "x:y", "-a", "a<b"])
def test_module_names_must_be_usable_as_tags(name: str) -> None:
    escaped = name.replace("<", "&lt;")
    schema_error(
        f'<schema name="t"><module name="{escaped}"/></schema>',
        PMLSyntaxError,
        1,
        18,
        f"invalid name '{name}'",
    )


def test_unexpected_attribute() -> None:
    schema_error(
        '<schema name="t">\n<union kind="x"><module name="a"/></union></schema>',
        PMLSyntaxError,
        2,
        1,
        "unexpected attribute 'kind' on <union>",
    )


def test_empty_union() -> None:
    schema_error(
        '<schema name="t">\n  <union>\n  </union>\n</schema>', PMLSyntaxError, 2, 3, "empty"
    )


def test_schema_tags_are_not_allowed_in_prompts() -> None:
    prompt_error(
        '<prompt schema="t">\n  <module name="a"/></prompt>',
        PMLSyntaxError,
        2,
        3,
        "<module> is not allowed inside a prompt",
    )
    prompt_error(
        '<prompt schema="t"><a><param name="p"/></a></prompt>',
        PMLSyntaxError,
        1,
        23,
        "<param> is not allowed",
    )


# --- misplaced content ---------------------------------------------------------------


def test_text_directly_inside_union() -> None:
    schema_error(
        '<schema name="t">\n  <union>\n    <module name="a"/>\n    or\n  </union>\n</schema>',
        MisplacedContentError,
        3,
        23,
        "text directly inside <union>",
    )


def test_param_outside_module() -> None:
    schema_error(
        '<schema name="t">\n  <param name="p" len="2"/></schema>',
        MisplacedContentError,
        2,
        3,
        "<param> outside a module",
    )
    schema_error(
        '<schema name="t"><system><param name="p" len="2"/></system></schema>',
        MisplacedContentError,
        1,
        26,
        "outside a module",
    )


def test_param_role_or_union_directly_inside_union() -> None:
    schema_error(
        '<schema name="t"><module name="m"><union><param name="p" len="2"/></union></module>'
        "</schema>",
        MisplacedContentError,
        1,
        42,
        "<param> directly inside <union>",
    )
    schema_error(
        '<schema name="t"><union><user>x</user></union></schema>',
        MisplacedContentError,
        1,
        25,
        "<user> directly inside <union>",
    )
    schema_error(
        '<schema name="t"><union><module name="a"/>\n<union><module name="b"/></union></union>'
        "</schema>",
        MisplacedContentError,
        2,
        1,
        "<union> inside another <union>",
    )


def test_role_nested_in_role() -> None:
    schema_error(
        '<schema name="t"><user>\n  <system>x</system></user></schema>',
        MisplacedContentError,
        2,
        3,
        "<system> nested inside another role",
    )
    # Through a module as well: the server renders one role at a time.
    schema_error(
        '<schema name="t"><user><module name="m"><assistant/></module></user></schema>',
        MisplacedContentError,
        1,
        41,
        "<assistant> nested",
    )


def test_role_inside_module_is_fine() -> None:
    schema = parse_schema('<schema name="t"><module name="m"><system>s</system></module></schema>')
    assert schema.modules()["m"].children == (Role("system", (Text("s", P(1, 43)),), P(1, 35)),)


@pytest.mark.parametrize(
    ("tail", "column"), [("\n  junk", 3), ('\n<schema name="u"/>', 1), ("\n<a/>", 1)]
)
def test_content_after_the_root_element(tail: str, column: int) -> None:
    schema_error(
        f'<schema name="t"/>{tail}', MisplacedContentError, 2, column, "after the root element"
    )
    prompt_error(f'<prompt schema="t"/>{tail}', MisplacedContentError, 2, column, "<prompt>")


def test_whitespace_and_comments_after_the_root_are_fine() -> None:
    assert parse_schema('<schema name="t"/>\n\n<!-- end -->\n').name == "t"


def test_text_inside_an_import() -> None:
    prompt_error(
        '<prompt schema="t">\n  <a x="1">\n    hello <b/>\n  </a>\n</prompt>',
        MisplacedContentError,
        2,
        12,
        "text inside import <a>",
    )


def test_import_inside_a_role_in_a_prompt() -> None:
    prompt_error(
        '<prompt schema="t"><user>Ask about\n <city-info city="Paris"/></user></prompt>',
        MisplacedContentError,
        2,
        2,
        "module import <city-info> inside role tag <user>",
    )


def test_roles_nested_or_inside_imports_in_a_prompt() -> None:
    prompt_error(
        '<prompt schema="t"><user><system>x</system></user></prompt>',
        MisplacedContentError,
        1,
        26,
        "<system> nested inside <user>",
    )
    prompt_error(
        '<prompt schema="t"><a><user>x</user></a></prompt>',
        MisplacedContentError,
        1,
        23,
        "<user> inside import <a>",
    )


# --- validation ------------------------------------------------------------------------


def test_prompt_for_another_schema(schema: Schema) -> None:
    validation_error(
        '\n  <prompt schema="hotels"/>', schema, UnknownSchemaError, 2, 3, "'hotels'", "'travel'"
    )


def test_unknown_module(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel">\n\n    <foo/></prompt>',
        schema,
        UnknownModuleError,
        3,
        5,
        "unknown module 'foo' in schema 'travel'",
    )


def test_nested_module_imported_at_top_level(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel"><city-info/>\n<city-history/></prompt>',
        schema,
        UnknownModuleError,
        2,
        1,
        "'city-history' is imported at the top level",
        "inside <city-info>",
    )


def test_nested_import_under_the_wrong_parent(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel"><plan-short><city-history/></plan-short></prompt>',
        schema,
        UnknownModuleError,
        1,
        37,
        "'city-history' is imported inside <plan-short>",
        "inside <city-info>",
    )
    validation_error(
        '<prompt schema="travel"><city-info><plan-long/></city-info></prompt>',
        schema,
        UnknownModuleError,
        1,
        36,
        "'plan-long' is imported inside <city-info>",
        "at the top level",
    )


def test_unknown_parameter(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel">\n <city-info town="Rome"/></prompt>',
        schema,
        UnknownModuleError,
        2,
        2,
        "unknown parameter 'town' for module 'city-info'",
        "city",
    )
    validation_error(
        '<prompt schema="travel"><plan-long days="3"/></prompt>',
        schema,
        UnknownModuleError,
        1,
        25,
        "unknown parameter 'days'",
        "none",
    )


def test_a_nested_module_does_not_take_its_parents_params(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel"><city-info><city-history city="x"/></city-info></prompt>',
        schema,
        UnknownModuleError,
        1,
        36,
        "unknown parameter 'city' for module 'city-history'",
    )


def test_two_members_of_one_union(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel">\n  <plan-short/>\n  text\n  <plan-long/>\n</prompt>',
        schema,
        UnionConflictError,
        4,
        3,
        "'plan-short' (at line 2, column 3)",
        "'plan-long'",
        "union",
    )


def test_members_of_different_unions_combine() -> None:
    schema = parse_schema(
        '<schema name="s"><union><module name="a"/><module name="b"/></union>'
        '<union><module name="c"/><module name="d"/></union></schema>'
    )
    validate_prompt(parse_prompt('<prompt schema="s"><a/><d/></prompt>'), schema)


def test_duplicate_import(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel"><city-info/>\n  <city-info city="Rome"/></prompt>',
        schema,
        DuplicateImportError,
        2,
        3,
        "'city-info' is imported twice",
        "line 1, column 25",
    )
    # A union member imported twice is a duplicate, not a union conflict.
    validation_error(
        '<prompt schema="travel"><plan-long/><plan-long/></prompt>',
        schema,
        DuplicateImportError,
        1,
        37,
        "'plan-long'",
    )


def test_argument_too_long(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel">\n<city-info city="one two three four five six seven eight nine"/>'
        "</prompt>",
        schema,
        ArgumentTooLongError,
        2,
        1,
        "argument 'city' of module 'city-info'",
        "9 tokens",
        "at most 8",
        count_tokens=words,
    )


def test_argument_of_exactly_len_tokens_is_fine(schema: Schema) -> None:
    prompt = parse_prompt('<prompt schema="travel"><city-info city="1 2 3 4 5 6 7 8"/></prompt>')
    validate_prompt(prompt, schema, words)


def test_without_a_token_counter_lengths_are_not_checked_but_names_are(schema: Schema) -> None:
    long = " ".join(["w"] * 50)
    validate_prompt(
        parse_prompt(f'<prompt schema="travel"><city-info city="{long}"/></prompt>'), schema
    )
    validation_error(
        f'<prompt schema="travel"><city-info town="{long}"/></prompt>',
        schema,
        UnknownModuleError,
        1,
        25,
        "unknown parameter 'town'",
    )


def test_missing_arguments_are_allowed(schema: Schema) -> None:
    validate_prompt(parse_prompt('<prompt schema="travel"><city-info/></prompt>'), schema, words)


def test_the_first_error_in_document_order_wins(schema: Schema) -> None:
    validation_error(
        '<prompt schema="travel"><city-info><nope/></city-info>\n<plan-short/><plan-long/>'
        "</prompt>",
        schema,
        UnknownModuleError,
        1,
        36,
        "'nope'",
    )


def test_count_tokens_receives_the_unescaped_argument(schema: Schema) -> None:
    seen: list[str] = []

    def count(text: str) -> int:
        seen.append(text)
        return 1

    validate_prompt(
        parse_prompt('<prompt schema="travel"><city-info city="A &amp; B"/></prompt>'),
        schema,
        count,
    )
    assert seen == ["A & B"]


# --- registry ----------------------------------------------------------------------------


def test_registry_add_get_list_remove(schema: Schema) -> None:
    registry = SchemaRegistry()
    assert registry.add(schema) is schema
    other = registry.add_source('<schema name="hotels"><module name="h"/></schema>')
    assert registry.list() == ["hotels", "travel"]
    assert list(registry) == ["hotels", "travel"]
    assert len(registry) == 2 and "travel" in registry and "nope" not in registry
    assert registry.get("travel") is schema and registry["hotels"] is other
    assert registry.remove("hotels") is other
    assert registry.list() == ["travel"]
    with pytest.raises(UnknownSchemaError, match="unknown schema 'hotels'"):
        registry.remove("hotels")


def test_registry_refuses_a_second_schema_of_one_name_unless_replacing(schema: Schema) -> None:
    registry = SchemaRegistry()
    registry.add(schema)
    newer = parse_schema('\n\n<schema name="travel"/>')
    raises_at(DuplicateSchemaError, 3, 1, "'travel' is already registered")(
        lambda: registry.add(newer)
    )
    assert registry.get("travel") is schema
    registry.add(newer, replace=True)
    assert registry.get("travel") is newer


def test_registry_unknown_schema_points_at_the_prompt() -> None:
    registry = SchemaRegistry()
    registry.add_source('<schema name="travel"/>')
    prompt = parse_prompt('\n <prompt schema="hotels"/>')
    err = raises_at(UnknownSchemaError, 2, 2, "unknown schema 'hotels'")(
        lambda: registry.get(prompt.schema, prompt.pos)
    )
    assert isinstance(err, LookupError)
    with pytest.raises(UnknownSchemaError) as info:
        registry["hotels"]
    assert (info.value.line, info.value.column) == (None, None)
    assert str(info.value) == "unknown schema 'hotels'; register it first"  # names no other


def test_registry_resolve_validates(schema: Schema) -> None:
    registry = SchemaRegistry()
    registry.add(schema)
    assert registry.resolve(parse_prompt(PROMPT), words) is schema
    bad = parse_prompt('<prompt schema="travel"><plan-short/><plan-long/></prompt>')
    with pytest.raises(UnionConflictError):
        registry.resolve(bad)
    with pytest.raises(UnknownSchemaError):
        registry.resolve(parse_prompt('<prompt schema="nope"/>'))


def test_nesting_depth_is_bounded() -> None:
    deep = '<prompt schema="s">' + "<a>" * 101 + "</a>" * 101 + "</prompt>"
    # The root is level 1, so the 100th <a> is the first too deep: 19 + 99 * 3 + 1.
    prompt_error(deep, PMLSyntaxError, 1, 317, "nested more than 100 deep")
    ok = '<prompt schema="s">' + "<a>" * 99 + "</a>" * 99 + "</prompt>"
    assert len(parse_prompt(ok).imports()) == 1


# --- writing -----------------------------------------------------------------------------


def unplaced(value: object) -> object:
    """``value`` with every position dropped, to compare parsed trees with built ones."""
    if isinstance(value, tuple):
        return tuple(unplaced(item) for item in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, Position | type):
        changes = {f.name: unplaced(getattr(value, f.name)) for f in dataclasses.fields(value)}
        return dataclasses.replace(value, **(changes | {"pos": UNPLACED}))
    return value


AWKWARD = 'a < b && c > d, "quoted" and \'single\'\nsecond line\ttab ]]> <!-- no comment -->'


def test_a_written_schema_reads_back_to_the_same_tree() -> None:
    built = Schema("travel", (
        Role("system", (Text(AWKWARD),)),
        Module("city-info", (Text("About "), Param("city", 8), Text(" follows."),
                             Module("city-history", (Text("history"),)))),
        Union((Module("plan-short", (Text("short"),)),
               Module("plan-long", (Role("user", (Text("long"),)),)))),
        Text("after everything"),
    ))
    assert unplaced(parse_schema(write_schema(built))) == built


def test_a_written_prompt_reads_back_to_the_same_tree() -> None:
    built = Prompt("travel", (
        Import("city-info", {"city": 'Paris & "Lyon"\n<Nice>\tCannes'},
               (Import("city-history", {}, ()),)),
        Text(AWKWARD),
        Import("plan-short", {}, ()),
        Role("user", (Text("What should I see first?"),)),
    ))
    assert unplaced(parse_prompt(write_prompt(built))) == built


def test_parsed_documents_survive_writing() -> None:
    schema, prompt = parse_schema(SCHEMA), parse_prompt(PROMPT)
    assert unplaced(parse_schema(write_schema(schema))) == unplaced(schema)
    assert unplaced(parse_prompt(write_prompt(prompt))) == unplaced(prompt)


def test_whitespace_only_text_is_refused_not_lost() -> None:
    with pytest.raises(ValueError, match="only whitespace"):
        write_prompt(Prompt("travel", (Import("plan-short", {}, ()), Text("  \n"))))
