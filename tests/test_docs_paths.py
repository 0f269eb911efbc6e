"""Every file the docs name in backticks is there, and every `module.name` they point a
newcomer to is defined in that module: a page that names a moved file sends its reader
nowhere, and mkdocs checks only links."""

import ast
import re
from pathlib import Path

import pytest

from tests.support.paths import REPO

PAGES = sorted([REPO / "README.md", REPO / "benchmarks" / "README.md",
                *(REPO / "docs").rglob("*.md")])
# A repository path in backticks, optionally with a `.name` after a module's path and a
# `:line` or `:name` after a file's.
NAMED = re.compile(r"`((?:client|upstream|fl_server|shared|benchmarks|tests|scripts|docs)"
                   r"/[\w./-]*\w)(?::[\w.]+)?`")
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
