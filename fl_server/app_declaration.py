"""The Flower app declaration shipped inside the package (``flower_app/pyproject.toml``):
what `flwr run` builds into a FAB. It names the installed modules and holds no code, so a
run can only use the meancache that every SuperLink and SuperNode has installed."""

import tomllib
from importlib.metadata import version
from importlib.resources import files
from pathlib import Path
from typing import Any

import tomli_w
from meancache.shared.fl.run_config import RunConfig

APP_NAME = "meancache-fl"


def declaration() -> dict[str, Any]:
    """The packaged pyproject.toml, parsed."""
    text = (files("meancache.fl_server") / "flower_app" / "pyproject.toml").read_text()
    return tomllib.loads(text)


def default_run_config() -> RunConfig:
    """Every run-config key with its default (runs override some)."""
    config: RunConfig = declaration()["tool"]["flwr"]["app"]["config"]
    return config


def write_app(parent: Path, device_config: RunConfig | None = None) -> Path:
    """Write the app into ``parent/meancache-fl/`` with the installed meancache version as
    its own, so the FAB (and `flwr ls`) names the version the run was started with, and
    ``device_config`` (keys of shared.fl.run_config.SIGNED_KEYS) as its defaults, so the
    operator's signature of the FAB covers what devices run with."""
    app = declaration()
    app["project"]["version"] = version("meancache")
    app["tool"]["flwr"]["app"]["config"].update(device_config or {})
    directory = parent / APP_NAME
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "pyproject.toml").write_text(tomli_w.dumps(app))
    return directory
