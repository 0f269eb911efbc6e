"""Write docs/reference/cli.md from the `meancache` argparse parser (meancache/cli.py), so
that the CLI reference cannot drift from the commands: every command and subcommand with
its help, usage and arguments. tests/test_cli_reference.py fails when the committed page
differs from what this prints.

    .venv/bin/python scripts/gen_cli_reference.py          # rewrite the page
    .venv/bin/python scripts/gen_cli_reference.py --check  # exit 1 if it is out of date
"""

import argparse
import html
import re
import sys
from collections.abc import Iterator
from pathlib import Path

from meancache.cli import build_parser

PAGE = Path(__file__).resolve().parent.parent / "docs" / "reference" / "cli.md"
WIDTH = 88  # the usage lines' width, fixed: the page must not depend on the terminal

HEADER = """# Command line reference

Generated from the argparse parser by `scripts/gen_cli_reference.py`; do not edit by hand
(a test fails when this page and the commands differ). `meancache COMMAND --help` prints
the same. The global options go before the command: `meancache --data-dir DIR chat`.
"""


def text(value: str | None) -> str:
    """Help text as Markdown that shows it literally (it is plain text, not Markdown)."""
    value = html.escape(" ".join((value or "").split()), quote=False)
    return re.sub(r"([\\`*_\[\]|#])", r"\\\1", value)


def usage(parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    formatter.add_usage(parser.usage, parser._actions, parser._mutually_exclusive_groups,
                        prefix="")
    return formatter.format_help().strip()


def argument_name(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
    if not action.option_strings:
        return formatter._metavar_formatter(action, action.dest)(1)[0]
    return formatter._format_action_invocation(action)


def subcommands(parser: argparse.ArgumentParser
                ) -> Iterator[tuple[str | None, argparse.ArgumentParser]]:
    """(help, parser) of each subcommand of ``parser``, in the order they were added."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, sub in action.choices.items():
                yield helps.get(name), sub


def section(parser: argparse.ArgumentParser, summary: str | None, level: int) -> list[str]:
    lines = [f"{'#' * level} `{parser.prog}`", ""]
    for paragraph in (summary, parser.description):
        if paragraph and text(paragraph) not in "\n".join(lines):
            lines += [text(paragraph), ""]
    lines += ["```text", usage(parser), "```", ""]
    rows = [action for action in parser._actions if action.help != argparse.SUPPRESS
            and not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))]
    if rows:
        lines += ["| argument | meaning |", "|---|---|"]
        formatter = argparse.HelpFormatter(parser.prog, width=WIDTH)
        for action in rows:
            meaning = formatter._expand_help(action) if action.help else ""
            lines.append(f"| `{argument_name(action, parser)}` | {text(meaning)} |")
        lines.append("")
    for help_text, sub in subcommands(parser):
        lines += section(sub, help_text, min(level + 1, 4))
    return lines


def render() -> str:
    return HEADER + "\n" + "\n".join(section(build_parser(), None, 2)).rstrip() + "\n"


def main(argv: list[str] | None = None) -> int:
    cli = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    cli.add_argument("--check", action="store_true",
                     help="only compare: exit 1 when the page is out of date")
    args = cli.parse_args(argv)
    page = render()
    if args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.exists() else ""
        if current != page:
            print(f"{PAGE} is out of date: run scripts/gen_cli_reference.py", file=sys.stderr)
            return 1
        return 0
    PAGE.parent.mkdir(parents=True, exist_ok=True)
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
