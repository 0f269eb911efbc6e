"""`meancache`'s commands each load their own side's settings, and `config show` prints a
side's settings with where each value came from."""

import argparse
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

from meancache.cli import LOADED, SIDES, build_parser, main

MODULE_OF_SIDE = {"client": "meancache.client.", "upstream": "meancache.upstream.",
                  "fl-server": "meancache.fl_server.", "shared": "meancache.shared."}


@pytest.fixture
def dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A config dir (returned) and a data dir of their own; logging restored after."""
    monkeypatch.setenv("MEANCACHE_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "config"))
    (tmp_path / "config").mkdir()
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield tmp_path / "config"
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


def leaves(parser: argparse.ArgumentParser, defaults: dict[str, object] | None = None,
           path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], dict[str, object]]]:
    """Every command that runs (has a handler), with the defaults it inherits."""
    defaults = {**(defaults or {}), **parser._defaults}
    subcommands = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subcommands:
        yield path, defaults
    for action in subcommands:
        for name, sub in action.choices.items():
            yield from leaves(sub, defaults, (*path, name))


def test_every_command_loads_the_settings_of_the_side_its_handler_belongs_to() -> None:
    found = dict(leaves(build_parser()))
    assert len(found) >= 25
    for path, defaults in found.items():
        handler = defaults["handler"]
        if path == ("config", "show"):
            assert handler.__module__ == "meancache.cli"  # --side chooses
            continue
        side = defaults.get("side")
        assert side in LOADED, path
        assert handler.__module__.startswith(MODULE_OF_SIDE[side]), (path, side)
    assert {found[path]["side"] for path in [("upstream", "serve"), ("pack", "build")]} == {
        "upstream"}
    assert {found[path]["side"] for path in [("fl", "server"), ("fl", "simulate")]} == {
        "fl-server"}
    assert {found[path]["side"] for path in [("chat",), ("fl", "join"), ("pack", "update")]
            } == {"client"}


def test_a_server_command_never_reads_the_devices_settings(
        dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A device setting config.toml gets wrong stops the device's commands, not the
    upstream's: each reads only its own keys."""
    (dirs / "config.toml").write_text('max_entries = 0\nupstream_model = "builtin:tiny"\n')
    assert main(["upstream", "stop"]) == 0
    assert "no embedded upstream is running" in capsys.readouterr().err
    assert main(["cache", "stats"]) == 2
    assert f"{dirs / 'config.toml'}: max_entries must be a positive" in " ".join(
        capsys.readouterr().err.split())


def test_a_flag_of_another_side_is_refused(dirs: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--backend", "torch", "upstream", "stop"]) == 2
    assert "--backend sets encoder_backend, which `upstream` does not use" in " ".join(
        capsys.readouterr().err.split())


@pytest.mark.parametrize("side", list(SIDES))
def test_config_show_prints_each_setting_and_where_it_came_from(
        dirs: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        side: str) -> None:
    (dirs / "config.toml").write_text('log_level = "debug"\nupstream_model = "builtin:tiny"\n'
                                      '[fl_server]\nencoder_model = "minilm"\n')
    monkeypatch.setenv("MEANCACHE_UPSTREAM_API_KEY", "sk-never-printed")
    assert main(["--encoder", "mpnet", "config", "show", "--side", side] if side != "upstream"
                else ["config", "show", "--side", side]) == 0
    out = capsys.readouterr().out
    lines = dict(line.split(" = ", 1) for line in out.splitlines()
                 if " = " in line and not line.startswith("#"))
    assert lines["log_level"] == f'"DEBUG"  # {dirs / "config.toml"}'
    assert lines["data_dir"].endswith("# MEANCACHE_DATA_DIR")
    assert set(lines) == set(SIDES[side].file_keys()) - {
        key for key in SIDES[side].file_keys() if f"# {key} unset" in out}
    assert "sk-never-printed" not in out
    if side == "client":
        assert lines["encoder_model"] == '"mpnet"  # --encoder'
        assert lines["upstream_api_key"] == '"(set)"  # MEANCACHE_UPSTREAM_API_KEY'
        assert lines["max_entries"] == "100000  # default"
    if side == "fl-server":
        assert lines["encoder_model"] == '"mpnet"  # --encoder'
        assert "upstream_model" not in out
    if side == "upstream":
        assert lines["upstream_model"] == f'"builtin:tiny"  # {dirs / "config.toml"}'
        assert "encoder_model" not in out and "max_entries" not in out


def test_config_show_names_the_flag_that_set_a_value(
        dirs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--data-dir", str(tmp_path / "flagged"), "--eviction-policy", "lfu",
                 "config", "show"]) == 0
    out = capsys.readouterr().out
    assert f'data_dir = "{tmp_path / "flagged"}"  # --data-dir' in out
    assert 'eviction_policy = "lfu"  # --eviction-policy' in out
    assert f'# config_dir = "{dirs}"  # MEANCACHE_CONFIG_DIR' in out


def test_config_show_prints_toml_that_loads_back_to_the_same_settings(
        dirs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (dirs / "config.toml").write_text(
        'max_entries = 7\nthreshold = 0.8\nupstream_url = "http://h:1"\n'
        '[keymap]\nreject = "ctrl+x"\n[upstream_sampling]\ndry_multiplier = 0.5\n'
        'stop_on_loops = false\n')
    assert main(["config", "show"]) == 0
    shown = "\n".join(line.split("  # ", 1)[0] for line in capsys.readouterr().out.splitlines()
                      if not line.startswith("#"))
    (dirs / "config.toml").write_text(shown + "\n")
    again = SIDES["client"].load(dirs)
    assert (again.max_entries, again.global_threshold, again.upstream_url) == (
        7, 0.8, "http://h:1")
    assert again.keymap == {"reject": "ctrl+x"}
    assert again.upstream_sampling == {"dry_multiplier": 0.5, "stop_on_loops": False}
