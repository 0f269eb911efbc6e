"""One exception tree: every error class lives in an errors module, derives from
MeanCacheError and has a name no other error has."""

import ast
import builtins
import importlib
import pkgutil
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


def test_the_root_docstring_draws_every_error() -> None:
    drawn = shared_errors.__doc__ or ""
    assert [cls.__name__ for cls in tree() if f" {cls.__name__}" not in drawn] == []
