"""One exception tree: every error class lives in an errors module, derives from
MeanCacheError, has a name no other error has, and is drawn where it derives from in the
docstrings that draw the tree (a newcomer reads the tree there)."""

import ast
import builtins
import importlib
import pkgutil
import re
from collections import Counter
from pathlib import Path

from meancache.shared import errors as shared_errors
from meancache.shared.errors import MeanCacheError

import meancache

# The editable install maps the sides to folders outside meancache/, where walking
# meancache.__path__ does not see them; an installed wheel finds them both ways.
SIDES = ("shared", "client", "upstream", "fl_server")


def all_modules() -> dict[str, Path]:
    """Every module of the package by name, with its source file, none of them imported
    (walk_packages imports only packages, to find what they hold)."""
    roots = [meancache, *(importlib.import_module(f"meancache.{side}") for side in SIDES)]
    modules: dict[str, Path] = {}
    for root in roots:
        modules[root.__name__] = Path(root.__file__)
        for info in pkgutil.walk_packages(root.__path__, f"{root.__name__}."):
            spec = info.module_finder.find_spec(info.name, None)
            modules[info.name] = Path(spec.origin)
    return modules


def declared_exceptions(source: str) -> list[str]:
    """Classes that look like exceptions: named ...Error/...Exception, or with such a base."""
    def exceptional(name: str) -> bool:
        builtin = getattr(builtins, name, None)
        return name.endswith(("Error", "Exception")) or (
            isinstance(builtin, type) and issubclass(builtin, BaseException))

    def base_name(node: ast.expr) -> str:
        return node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")

    return [node.name for node in ast.walk(ast.parse(source)) if isinstance(node, ast.ClassDef)
            and (exceptional(node.name) or any(exceptional(base_name(b)) for b in node.bases))]


def tree() -> list[type[BaseException]]:
    """The exception classes the errors modules define."""
    classes = []
    for name in all_modules():
        if name.rsplit(".", 1)[-1] != "errors":
            continue
        module = importlib.import_module(name)
        classes += [value for value in vars(module).values()
                    if isinstance(value, type) and issubclass(value, BaseException)
                    and value.__module__ == name]
    return classes


def test_the_detector_sees_a_new_exception_class() -> None:
    assert declared_exceptions("class FooError(Exception):\n    pass") == ["FooError"]
    assert declared_exceptions("class Oops(ValueError): ...\nclass Fine: ...") == ["Oops"]
    assert declared_exceptions("class Bad(errors.MeanCacheError): ...") == ["Bad"]


def test_only_errors_modules_define_exceptions() -> None:
    modules = all_modules()
    assert {"meancache.cli", "meancache.client.upstream_client",
            "meancache.upstream.server.app", "meancache.fl_server.server_app"} <= modules.keys()
    elsewhere = {name: found for name, path in modules.items()
                 if name.rsplit(".", 1)[-1] != "errors"
                 and (found := declared_exceptions(path.read_text(encoding="utf-8")))}
    assert elsewhere == {}


def test_every_error_derives_from_meancache_error_and_has_its_own_name() -> None:
    classes = tree()
    assert {"meancache.shared.errors", "meancache.client.errors",
            "meancache.upstream.errors"} <= {cls.__module__ for cls in classes}
    assert [cls for cls in classes if not issubclass(cls, MeanCacheError)] == []
    duplicates = [name for name, n in Counter(cls.__name__ for cls in classes).items() if n > 1]
    assert duplicates == []


# A drawn line: the block's indent, a unit of 4 characters per level above ("│   " or
# blank), the branch, the class's name, then anything (its module, a note).
DRAWN_LINE = re.compile(r"^    ((?:│   |    )*)(?:├── |└── )(\w+)")
DRAWN_ROOT = re.compile(r"^    (\w+)")


def drawn_parents(doc: str) -> dict[str, str | None]:
    """The tree a docstring draws: each class name with the name drawn above it (None for
    the drawing's root)."""
    parents: dict[str, str | None] = {}
    path: list[str] = []  # the names from the root down to the line before
    for line in doc.splitlines():
        if match := DRAWN_LINE.match(line):
            depth = len(match[1]) // 4 + 1
            if not 0 < depth <= len(path):
                raise AssertionError(f"a line drawn under nothing: {line!r}")
            del path[depth:]
            parents[match[2]] = path[-1]
            path.append(match[2])
        elif path == [] and (root := DRAWN_ROOT.match(line)) and root[1].endswith("Error"):
            parents[root[1]] = None
            path = [root[1]]
    return parents


def error_parent(cls: type[BaseException]) -> str:
    """The class's own parent in the tree: its first base that is a MeanCacheError."""
    return next(base.__name__ for base in cls.__bases__ if issubclass(base, MeanCacheError))


def test_a_drawing_is_read_with_its_parents() -> None:
    doc = ("Errors::\n\n    AError\n    ├── BError\n    │   └── CError (KeyError)\n"
           "    └── DError                meancache.x\n")
    assert drawn_parents(doc) == {"AError": None, "BError": "AError", "CError": "BError",
                                  "DError": "AError"}


def test_each_errors_docstring_draws_its_classes_under_their_parents() -> None:
    """The root module draws the whole tree and each side's errors module its own part:
    every class where it derives from, and no class that is gone."""
    classes = {cls.__name__: cls for cls in [*tree(), MeanCacheError]}
    for module in {shared_errors, *(importlib.import_module(cls.__module__)
                                    for cls in tree())}:
        drawn = drawn_parents(module.__doc__ or "")
        assert drawn, module.__name__
        assert sorted(set(drawn) - set(classes)) == [], f"{module.__name__} draws these"
        whole_tree = module is shared_errors  # the root module draws every class
        for cls in classes.values():
            if cls is MeanCacheError or not (whole_tree or cls.__module__ == module.__name__):
                continue
            assert cls.__name__ in drawn, f"{module.__name__} does not draw {cls.__name__}"
            if drawn[cls.__name__] is not None:  # the drawing's own root has none drawn
                assert drawn[cls.__name__] == error_parent(cls), (module.__name__, cls)
