"""The `meancache` command: the device's commands (chat, ask, cache, eval, fl join/sync),
the upstream server's (upstream serve) and the FL server's (fl simulate/server/run) under
one parser, with the global options, settings and logging they share."""

import argparse
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from meancache.client import cli as device_commands
from meancache.client.config import load_settings
from meancache.client.fl import commands as fl_device_commands
from meancache.client.logs import setup_logging
from meancache.client.pack import commands as pack_device_commands
from meancache.client.private_files import check_data_dir, owner_only_files
from meancache.embedded import start_embedded_upstream, start_shared_upstream
from meancache.fl_server import cli as fl_server_commands
from meancache.shared.encoder import BACKENDS
from meancache.shared.errors import MeanCacheError
from meancache.shared.verifier import commands as verifier_commands
from meancache.upstream import cli as upstream_commands
from meancache.upstream.pack import commands as pack_builder_commands

err = Console(stderr=True)


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
    device_commands.add_commands(commands, start_embedded_upstream, start_shared_upstream)
    upstream_commands.add_commands(commands)
    pack = commands.add_parser("pack", help="instruction packs (InstCache): build on the "
                               "upstream, download and answer on the device")
    pack_commands = pack.add_subparsers(dest="pack_command", required=True)
    pack_device_commands.add_commands(pack_commands)
    pack_builder_commands.add_commands(pack_commands)
    fl = commands.add_parser("fl", help="federated learning of the encoder and threshold")
    fl_commands = fl.add_subparsers(dest="fl_command", required=True)
    fl_server_commands.add_commands(fl_commands)
    fl_device_commands.add_commands(fl_commands)
    verifier_commands.add_commands(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.config_dir, args.data_dir, encoder_model=args.encoder,
                                 encoder_backend=args.backend,
                                 eviction_policy=args.eviction_policy)
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
