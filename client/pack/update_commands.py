"""`meancache pack update|stats`: the device's instruction-pack commands."""

import argparse
import dataclasses
from typing import Any

from meancache.client.config import Settings
from meancache.client.pack.download import DEFAULT_MAX_PACK_BYTES
from meancache.shared.arguments import real


def add_commands(pack: Any) -> None:
    update = pack.add_parser("update", help="download the upstream's newest instruction "
                             "pack (resumes a cut download; the old pack stays on failure)")
    update.add_argument("--upstream", metavar="URL", help="the upstream server (default: "
                        "upstream_url in config.toml)")
    update.add_argument("--api-key", help="bearer key for the upstream (default: "
                        "upstream_api_key in config.toml or MEANCACHE_UPSTREAM_API_KEY)")
    update.add_argument("--max-mb", type=real(above=0), default=DEFAULT_MAX_PACK_BYTES / 2**20,
                        help="refuse a larger pack (default: %(default).0f)")
    update.add_argument("--allow-downgrade", action="store_true",
                        help="install a pack built before the one in use (refused otherwise, "
                        "as a rollback; also the allow_downgrade setting)")
    update.set_defaults(handler=run_update)
    stats = pack.add_parser("stats", help="the pack in use: version, entries, size, hits")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(handler=run_stats)


def run_update(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.errors import ConfigError
    from meancache.client.pack.download import download_pack
    from meancache.client.pack.store import PACK_FILE
    from meancache.client.upstream_client import UpstreamClient
    from meancache.shared.progress_bar import ProgressBar
    from rich.console import Console

    url = args.upstream or settings.upstream_url
    if not url:
        raise ConfigError("no upstream to fetch the pack from: pass --upstream URL or set "
                          "upstream_url in config.toml")
    with ProgressBar("downloading the instruction pack", Console(stderr=True)) as progress:
        upstream = UpstreamClient(url, args.api_key or settings.upstream_api_key)
        update = download_pack(upstream, settings.packs_dir / PACK_FILE,
                               int(args.max_mb * 2**20), progress,
                               args.allow_downgrade or settings.allow_downgrade)
    manifest = update.manifest
    if update.changed:
        print(f"instruction pack {manifest.pack_id} is in use: {manifest.count} instructions "
              f"answered by {manifest.model} (sigma {manifest.sigma:g}, built "
              f"{manifest.created})")
    else:
        print(f"already up to date (pack {manifest.pack_id}, {manifest.count} instructions)")
    return 0


def run_stats(args: argparse.Namespace, settings: Settings) -> int:
    import json

    from meancache.client.pack.store import PackStore
    from rich.console import Console
    from rich.table import Table

    stats = PackStore(settings.packs_dir).stats()
    if args.json:
        print(json.dumps(dataclasses.asdict(stats)))
        return 0
    table = Table("statistic", "value", title=f"instruction pack in {settings.packs_dir}")
    for key, value in dataclasses.asdict(stats).items():
        table.add_row(key.replace("_", " "), "-" if value is None else str(value))
    Console().print(table)
    return 0
