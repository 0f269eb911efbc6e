"""The `meancache` command: the device's commands (chat, ask, cache, eval, fl join/sync),
the upstream server's (upstream serve) and the FL server's (fl simulate/server/run) under
one parser, with the global options and logging they share. Each command loads its own
side's settings alone (``SIDES``), never another side's."""

import argparse
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape

from meancache.client import device_commands
from meancache.client.config import Settings
from meancache.client.fl import join_sync_commands as fl_device_commands
from meancache.client.logs import setup_logging
from meancache.client.pack import update_commands as pack_device_commands
from meancache.client.private_files import check_data_dir, owner_only_files
from meancache.embedded import start_embedded_upstream, start_shared_upstream
from meancache.fl_server import server_commands as fl_server_commands
from meancache.fl_server.config import FlServerSettings
from meancache.shared.arguments import undecodable_text
from meancache.shared.encoder import BACKENDS
from meancache.shared.errors import ConfigError, MeanCacheError
from meancache.shared.settings import SettingsBase, toml_value
from meancache.shared.verifier import training_commands as verifier_commands
from meancache.upstream import serve_commands as upstream_commands
from meancache.upstream.config import UpstreamSettings
from meancache.upstream.pack import build_commands as pack_builder_commands

err = Console(stderr=True)

# Whose settings a command loads: the side it belongs to (the verifier's training, in the
# shared layer, needs only where data and logs go).
SIDES: dict[str, type[SettingsBase]] = {"client": Settings, "upstream": UpstreamSettings,
                                        "fl-server": FlServerSettings}
LOADED = SIDES | {"shared": SettingsBase}
# The global flags that set a setting: flag -> the field it sets (on the sides that have it).
SETTING_FLAGS = {"config_dir": "config_dir", "data_dir": "data_dir", "encoder": "encoder_model",
                 "backend": "encoder_backend", "eviction_policy": "eviction_policy"}


def add_side(commands: Any, side: str, add: Callable[[], None]) -> None:
    """Run ``add`` (a side's add_commands) and mark the commands it adds as ``side``'s."""
    before = set(commands.choices)
    add()
    for name in commands.choices.keys() - before:
        commands.choices[name].set_defaults(side=side)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meancache", description=__doc__)
    parser.add_argument("--config-dir", type=Path,
                        help="where config.toml lives (default: the platform's config dir)")
    parser.add_argument("--data-dir", type=Path, help="where the cache, models and logs "
                        "live (default: the platform's user data dir)")
    parser.add_argument("--encoder", metavar="MODEL", help="'mpnet' (default), 'minilm' "
                        "(fast) or a local sentence-transformers model directory")
    parser.add_argument("--backend", choices=BACKENDS, help="encoder runtime "
                        "(default: encoder_backend in config.toml, onnx-int8)")
    parser.add_argument("--eviction-policy", metavar="POLICY", help="what the cache keeps and "
                        "evicts: lru, lfu, scalm-co or scalm-se (default: eviction_policy "
                        "in config.toml, lru)")
    commands = parser.add_subparsers(dest="command", required=True)
    add_side(commands, "client", lambda: device_commands.add_commands(
        commands, start_embedded_upstream, start_shared_upstream))
    add_side(commands, "upstream", lambda: upstream_commands.add_commands(commands))
    pack = commands.add_parser("pack", help="instruction packs (InstCache): build on the "
                               "upstream, download and answer on the device")
    pack_commands = pack.add_subparsers(dest="pack_command", required=True)
    add_side(pack_commands, "client", lambda: pack_device_commands.add_commands(pack_commands))
    add_side(pack_commands, "upstream",
             lambda: pack_builder_commands.add_commands(pack_commands))
    fl = commands.add_parser(
        "fl", help="federated learning of the encoder, the verifier and the error bound")
    fl_commands = fl.add_subparsers(dest="fl_command", required=True)
    add_side(fl_commands, "fl-server", lambda: fl_server_commands.add_commands(fl_commands))
    add_side(fl_commands, "client", lambda: fl_device_commands.add_commands(fl_commands))
    add_side(commands, "shared", lambda: verifier_commands.add_commands(commands, _load_gemma))
    config = commands.add_parser("config", help="the settings in effect")
    config_commands = config.add_subparsers(dest="config_command", required=True)
    show = config_commands.add_parser("show", help="each setting of one side, its value and "
                                      "where it came from (default, config.toml, environment "
                                      "variable or command line)")
    show.add_argument("--side", choices=SIDES, default="client",
                      help="whose settings (default: %(default)s, the device's)")
    show.set_defaults(handler=show_config)
    return parser


def _load_gemma(data_dir: Path) -> tuple[Any, Any]:
    """builtin:gemma-3-270m (the upstream's converted copy) for `verifier make-paraphrases`,
    imported only when that command asks for it."""
    from meancache.upstream.gemma import load_gemma

    return load_gemma(data_dir, "cpu")


def show_config(args: argparse.Namespace, settings: SettingsBase) -> int:
    """Print ``key = value  # origin`` lines: TOML a user can copy into config.toml (an
    unset setting, and config_dir, which says where that file is, as comments)."""
    state = "" if settings.config_file.is_file() else " (absent: defaults)"
    print(f"# {args.side} settings; config file {settings.config_file}{state}")
    for key, value, origin in settings.effective():
        line = f"{key} = {toml_value(value)}" if value is not None else f"{key} unset"
        print(f"{'# ' if value is None or key == 'config_dir' else ''}{line}  # {origin}")
    return 0


def load_side(args: argparse.Namespace) -> SettingsBase:
    """The settings of the side ``args.command`` belongs to, and those alone: a global flag
    that sets another side's setting is an error, not silently dropped."""
    side = LOADED[args.side]
    flags, names = {}, {}
    for flag, name in SETTING_FLAGS.items():
        value = getattr(args, flag)
        if value is None:
            continue
        if name not in side.model_fields:
            raise ConfigError(f"--{flag.replace('_', '-')} sets {name}, which "
                              f"`{args.command}` does not use")
        flags[name], names[name] = value, f"--{flag.replace('_', '-')}"
    return side.load(flags.pop("config_dir", None), flag_names=names, **flags)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if (undecodable := undecodable_text(args, sys.argv[1:] if argv is None else argv)):
            raise ConfigError(undecodable)  # named, never a UnicodeEncodeError later
        settings = load_side(args)
        with owner_only_files():
            check_data_dir(settings.data_dir)
            try:
                setup_logging(settings.log_file, settings.log_level)
            except OSError as exc:
                raise MeanCacheError(f"cannot write the log file {settings.log_file}: "
                                     f"{exc.strerror}; fix its permissions or pass --data-dir "
                                     "with a writable directory") from None
            return int(args.handler(args, settings))
    except MeanCacheError as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
