"""Every file the docs name in backticks is there, and every `module.name` they point a
newcomer to is defined in that module: a page that names a moved file sends its reader
nowhere, and mkdocs checks only links. The same for the files the code's docstrings and
comments name."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

from tests.support.paths import REPO

PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md",
                *(REPO / "docs").rglob("*.md")])
# A path in the repository's folders (a `.name` may follow a module's path).
PATH = r"((?:client|upstream|fl_server|shared|benchmarks|tests|scripts|docs)/[\w./-]*\w)"
# On a page: in backticks, optionally with a `:line` or `:name` after a file's path.
NAMED = re.compile(rf"`{PATH}(?::[\w.]+)?`")
# In a docstring or a comment, where no backticks mark it: not inside a longer path
# ("../shared/data" is beside the repository, not in it).
NAMED_IN_CODE = re.compile(rf"(?<![\w./-]){PATH}")
SOURCES = sorted(path for side in ("meancache", "client", "upstream", "fl_server", "shared",
                                   "benchmarks", "tests", "scripts")
                 for path in (REPO / side).rglob("*.py") if "__pycache__" not in path.parts)
# Files a page names as not made yet, with why (the page says so beside the name).
NOT_MADE = {
    "docs/nll_cdf.png": "needs Gemma 3 270M fine-tuned for hours (benchmarks/README.md)",
}


def defines(module: Path, name: str) -> bool:
    """Whether ``module`` defines ``name`` at its top level (a function, a class or an
    assignment)."""
    for node in ast.parse(module.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            if node.name == name:
                return True
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                return True
    return False


def missing(named: str) -> str | None:
    """What is missing of a named path: None where the file (or module and name) is
    there."""
    if (REPO / named).exists() or named in NOT_MADE:
        return None
    module, _, name = named.rpartition(".")
    if module and (REPO / f"{module}.py").is_file():
        return None if defines(REPO / f"{module}.py", name) else f"{module}.py has no {name}"
    return "no such file"


def prose(source: str) -> str:
    """A module's docstrings and comments, where the code tells its reader where to look."""
    docstrings = [ast.get_docstring(node, clean=False) or "" for node in ast.walk(ast.parse(source))
                  if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef
                                | ast.AsyncFunctionDef)]
    comments = [token.string for token in tokenize.generate_tokens(io.StringIO(source).readline)
                if token.type == tokenize.COMMENT]
    return "\n".join(docstrings + comments)


def test_the_reader_finds_a_missing_file_and_a_missing_name() -> None:
    assert missing("client/matching/rules.py") is None
    assert missing("shared/words.stem") is None
    assert missing("client/cache/verification.py") == "no such file"
    assert missing("shared/words.no_such_word") == "shared/words.py has no no_such_word"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_every_path_a_page_names_is_there(page: Path) -> None:
    named = {m[1].rstrip(".") for m in NAMED.finditer(page.read_text(encoding="utf-8"))}
    assert {n: why for n in sorted(named) if (why := missing(n))} == {}


def test_what_is_not_made_yet_is_still_named_and_still_missing() -> None:
    """An entry of NOT_MADE that a page no longer names, or that now exists, goes."""
    text = "".join(page.read_text(encoding="utf-8") for page in PAGES)
    assert [n for n in NOT_MADE if f"`{n}`" not in text or (REPO / n).exists()] == []


def test_every_path_the_code_names_in_its_prose_is_there() -> None:
    assert len(SOURCES) > 100 and REPO / "tests" / "test_docs_paths.py" in SOURCES
    wrong = {}
    for source in SOURCES:
        named = {m[1].rstrip(".") for m in NAMED_IN_CODE.finditer(
            prose(source.read_text(encoding="utf-8")))}
        wrong |= {f"{source.relative_to(REPO)}: {n}": why
                  for n in sorted(named) if (why := missing(n))}
    assert wrong == {}


def test_the_scripts_page_lists_every_benchmark() -> None:
    """benchmarks/README.md's table of scripts (the docs' "The scripts" page) names each
    script once and no script that is gone: a newcomer finds every measurement there."""
    text = (REPO / "benchmarks" / "README.md").read_text(encoding="utf-8")
    listed = re.findall(r"^\| `(\w+\.py)` \|", text, flags=re.MULTILINE)
    scripts = sorted(p.name for p in (REPO / "benchmarks").glob("*.py")
                     if not p.name.startswith("_"))
    assert len(scripts) > 30
    assert sorted(listed) == scripts
