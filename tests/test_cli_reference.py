"""docs/reference/cli.md is generated from the `meancache` parser and committed: it must be
what the generator writes now, so the CLI reference cannot drift from the commands."""

import argparse
import importlib.util
from types import ModuleType

from meancache.cli import build_parser
from tests.support.paths import REPO


def generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_cli_reference", REPO / "scripts" / "gen_cli_reference.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def command_paths(parser: argparse.ArgumentParser) -> list[str]:
    paths = [parser.prog]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                paths += command_paths(sub)
    return paths


def test_the_committed_cli_reference_is_up_to_date() -> None:
    page = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    assert page == generator().render(), (
        "docs/reference/cli.md is out of date: run .venv/bin/python "
        "scripts/gen_cli_reference.py and commit it")


def test_every_command_and_option_has_its_place_in_the_reference() -> None:
    page = generator().render()
    paths = command_paths(build_parser())
    assert len(paths) > 30  # chat, ask, proxy, cache *, fl *, pack *, upstream *, ...
    for path in paths:
        assert f"# `{path}`\n" in page, path
    for option in ("--upstream URL", "--api-key API_KEY", "--packs-dir", "--key"):
        assert f"| `{option}" in page, option
