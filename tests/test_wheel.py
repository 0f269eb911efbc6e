"""The built wheel on its own: installed away from the source tree, it runs its commands
and keeps the import contracts (layers, no cycles) that pyproject.toml declares."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel built from this tree, installed into a directory of its own (its
    dependencies come from this environment). It is built from a copy: setuptools builds
    in the source directory and would keep modules deleted since an earlier build."""
    source = tmp_path_factory.mktemp("source") / "meancache"
    wheels, target = tmp_path_factory.mktemp("wheels"), tmp_path_factory.mktemp("site")
    shutil.copytree(REPO, source, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "*.egg-info", "__pycache__", ".*_cache"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                    "--no-build-isolation", "--wheel-dir", str(wheels), str(source)],
                   check=True, capture_output=True, cwd=wheels)
    (wheel,) = wheels.glob("meancache-*.whl")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--target", str(target), str(wheel)], check=True, capture_output=True)
    return target


def run_installed(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Run from the install directory, so that neither the source tree nor an editable
    install can answer an import first."""
    env = {**os.environ, "PYTHONPATH": str(site), "MEANCACHE_DATA_DIR": str(site / "data")}
    return subprocess.run(list(args), cwd=site, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_wheel_holds_every_side_under_one_namespace(installed: Path) -> None:
    package = installed / "meancache"
    for side in ("client", "shared", "upstream", "fl_server"):
        assert (package / side / "__init__.py").is_file(), side
        assert not (installed / side).exists(), f"a top-level '{side}' package was installed"
    # The Flower app that `meancache fl run` submits ships inside the package.
    assert (package / "fl_server" / "flower_app" / "pyproject.toml").is_file()
    # So does the learned verifier, with the card its hash is checked against.
    for name in ("verifier.onnx", "verifier.json"):
        assert (package / "shared" / "verifier" / "artefact" / name).is_file(), name
    assert (package / "shared" / "verifier" / "decision.json").is_file()  # the decision's card


def test_installed_commands_run_without_the_source_tree(installed: Path) -> None:
    where = run_installed(installed, sys.executable, "-c", "import meancache.client, "
                          "meancache.cli; print(meancache.client.__file__)")
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(installed)

    top = run_installed(installed, sys.executable, "-m", "meancache", "--help")
    assert top.returncode == 0, top.stderr
    for command in ("chat", "ask", "cache", "eval", "upstream", "fl"):
        assert command in top.stdout

    simulate = run_installed(installed, sys.executable, "-m", "meancache", "fl", "simulate",
                             "--help")
    assert simulate.returncode == 0, simulate.stderr
    assert "--clients" in simulate.stdout


def test_import_contracts_hold(installed: Path) -> None:
    """import-linter reads the installed package: the layers point one way and no two
    sibling packages or modules import each other."""
    result = run_installed(installed, str(BIN / "lint-imports"), "--config",
                           str(REPO / "pyproject.toml"), "--no-cache")
    assert result.returncode == 0, result.stdout[-4000:]
    assert "0 broken" in result.stdout
