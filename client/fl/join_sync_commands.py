"""`meancache fl join|sync`: a device's commands."""

import argparse
from pathlib import Path
from typing import Any

from meancache.client.config import Settings
from meancache.shared.hosts import port_argument


def add_commands(fl: Any) -> None:
    formatter = argparse.ArgumentDefaultsHelpFormatter
    join = fl.add_parser("join", help="take part in federated rounds: a Flower SuperNode "
                         "that trains on this user's data (nothing else leaves the device)",
                         formatter_class=formatter)
    join.add_argument("--superlink", default="127.0.0.1:9093", metavar="HOST:PORT",
                      help="the FL server's SuperLink")
    join.add_argument("--port", type=port_argument, default=9094, help="the SuperNode's local port")
    join.add_argument("--root-certificate", type=Path,
                      help="the CA certificate, for TLS (None: fl_root_certificate)")
    join.add_argument("--insecure", action="store_true",
                      help="allow a plain connection to a SuperLink on another host")
    join.add_argument("--auth-key", type=Path, help="this device's private key, for a "
                      "SuperLink started with --supernode-auth (its .pub registered there)")
    join.add_argument("--app-key", metavar="KEY_OR_FILE",
                      help="the operator's app-signing-key.pub (its ssh-ed25519 line, or the "
                      "file): the node runs only Flower apps signed with it (None: "
                      "fl_app_public_key)")
    join.add_argument("--allow-unsigned-apps", action="store_true",
                      help="run whatever Flower app the FL server hands out (a lab only: "
                      "whoever submits a run there runs code on this device)")
    join.add_argument("--server-key", metavar="KEY_OR_FILE",
                      help="the FL server's signing-key.pub (its one line, or the file): "
                      "the global model of a round is kept only signed with it and fresh, "
                      "as `fl sync` installs one (None: fl_server_public_key)")
    join.set_defaults(handler=run_join)

    sync = fl.add_parser("sync", help="download the newest signed global model (encoder, "
                         "verifier), its threshold and the pooled bound evidence",
                         formatter_class=formatter)
    sync.add_argument("--server", default="http://127.0.0.1:9100", metavar="URL",
                      help="the FL server's global-model endpoint")
    sync.add_argument("--root-certificate", type=Path,
                      help="the CA certificate of an https server (None: fl_root_certificate)")
    sync.add_argument("--insecure", action="store_true",
                      help="allow plain http to a server on another host")
    sync.add_argument("--server-key", metavar="KEY_OR_FILE",
                      help="the FL server's signing-key.pub (its one line, or the file): "
                      "only a global model signed with it is installed (None: "
                      "fl_server_public_key)")
    sync.add_argument("--allow-unsigned", action="store_true",
                      help="install a global model without checking the FL server's "
                      "signature (a lab only: whoever can change what the server sends "
                      "chooses this device's model)")
    sync.add_argument("--allow-downgrade", action="store_true",
                      help="install a signed global model older than the one this device "
                      "has or has seen replaced (refused otherwise, as a rollback; also the "
                      "allow_downgrade setting)")
    sync.set_defaults(handler=run_sync)


def run_join(args: argparse.Namespace, settings: Settings) -> int:
    import sys

    from meancache.client.fl.supernode import (
        supernode_command,
        supernode_environment,
        trusted_entities,
    )
    from meancache.shared.processes import run_foreground

    trusted = trusted_entities(settings.data_dir, args.app_key or settings.fl_app_public_key,
                               args.allow_unsigned_apps or settings.fl_allow_unsigned_apps)
    # the SuperLink's address and the certificate are checked before anything is said
    command = supernode_command(args.superlink, args.port, settings.data_dir,
                                args.root_certificate or settings.fl_certificate,
                                args.insecure or settings.fl_insecure, args.auth_key, trusted)
    signed = "apps signed by the operator's key" if trusted else "any app (unsigned allowed)"
    print(f"meancache fl join: training on {settings.data_dir} for {args.superlink}, "
          f"running {signed}", file=sys.stderr, flush=True)
    environment = supernode_environment(settings.data_dir)
    server_key = args.server_key or settings.fl_server_public_key
    if server_key:  # what the ClientApp reads its settings from
        environment["MEANCACHE_FL_SERVER_PUBLIC_KEY"] = server_key
    elif not settings.fl_allow_unsigned:
        print("warning: no FL server key (--server-key or fl_server_public_key): this device "
              "trains but keeps no global model from the rounds", file=sys.stderr, flush=True)
    return run_foreground(command, environment)


def run_sync(args: argparse.Namespace, settings: Settings) -> int:
    from meancache.client.fl.sync import sync_global_model
    from meancache.shared.progress_bar import ProgressBar
    from rich.console import Console

    certificate = args.root_certificate or settings.fl_root_certificate
    device = settings.model_copy(update={
        "fl_insecure": args.insecure or settings.fl_insecure,
        "fl_root_certificate": str(certificate) if certificate else None,
        "fl_server_public_key": args.server_key or settings.fl_server_public_key,
        "fl_allow_unsigned": args.allow_unsigned or settings.fl_allow_unsigned,
        "allow_downgrade": args.allow_downgrade or settings.allow_downgrade})
    err = Console(stderr=True)
    with ProgressBar("downloading the global model", err) as progress:
        result = sync_global_model(args.server, device, progress)
    if result.changed:
        print(f"installed the global model of round {result.round} (threshold "
              f"{result.threshold:.3f}); the cache re-embeds under it when it next opens")
    else:
        print(f"already up to date (round {result.round})")
    return 0
