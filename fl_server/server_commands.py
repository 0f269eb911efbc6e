"""`meancache fl simulate|server|run`: the FL server's commands."""

import argparse
import hashlib
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.config import FlServerSettings
from meancache.shared.arguments import count, real
from meancache.shared.hosts import port_argument

if TYPE_CHECKING:  # the type only: Flower's simulation loads with the command
    from meancache.fl_server.simulate import SimulationConfig

DEFAULT_PAIRS = Path(__file__).resolve().parents[1].parent / "shared/data/qqp/pairs.jsonl"


def add_commands(fl: Any) -> None:
    """Options that set a run-config key default to the Flower app's value (the one
    source of defaults), shown in --help."""
    app = default_run_config()
    formatter = argparse.ArgumentDefaultsHelpFormatter
    simulate = fl.add_parser("simulate", help="federated rounds on the simulation engine",
                             formatter_class=formatter)
    simulate.add_argument("--clients", type=count(1), default=20, help="simulated devices")
    simulate.add_argument("--per-round", type=count(1), default=4,
                          help="devices that train in each round")
    simulate.add_argument("--rounds", type=count(1), default=app["num-server-rounds"],
                          help="federated rounds")
    simulate.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS,
                          help="labelled pairs JSONL (train split partitioned, dev held out)")
    simulate.add_argument("--partitioning", choices=("iid", "topic"),
                          default=app["partitioning"], help="how devices' pairs are drawn")
    simulate.add_argument("--pairs-per-client", type=count(1), default=app["pairs-per-client"],
                          help="labelled pairs each device trains on")
    simulate.add_argument("--top-layers", type=count(0), default=app["top-layers"],
                          help="train and send only the top N transformer layers (0: all)")
    simulate.add_argument("--verifier-layers", type=count(0), default=app["verifier-top-layers"],
                          help="train and send the learned verifier's top N layers and its "
                          "head beside the encoder (0: the verifier is not federated)")
    simulate.add_argument("--verifier-only", action="store_true",
                          help="federate the learned verifier alone: the encoder stays the "
                          "base model, so caches keep their vectors and the cosine's pooled "
                          "labels keep applying (run config train-encoder = 0; needs "
                          "--verifier-layers over 0)")
    simulate.add_argument("--secure-aggregation", action="store_true",
                          help="SecAgg+: the server learns only the sum of the devices' "
                          "weights (no median; with --dp-noise, devices clip and the "
                          "server adds the noise to the sum)")
    simulate.add_argument("--secure-upload-mb", type=real(0), default=app["secure-upload-mb"],
                          help="with --secure-aggregation, the most a device sends of its "
                          "masked weights a round, in MB: past it, each large tensor's "
                          "shared entries only, the rest kept for its next round (0: every "
                          "entry)")
    simulate.add_argument("--update-bits", type=int, choices=(0, 8, 4),
                          default=app["update-bits"], help="devices send their update "
                          "quantised to 8 or 4 bits (0: float32 weights)")
    simulate.add_argument("--update-rank", type=count(0), default=app["update-rank"],
                          help="devices send each trained matrix's update as its rank-R "
                          "factors (truncated SVD; 0: every value; with --update-bits 8 or 4)")
    simulate.add_argument("--epochs", type=count(1), default=app["epochs"],
                          help="local epochs per round")
    simulate.add_argument("--learning-rate", type=real(above=0), default=app["learning-rate"],
                          help="devices' local learning rate")
    simulate.add_argument("--held-out", type=count(0), default=app["held-out-pairs"],
                          help="dev pairs the global model is scored on each round")
    simulate.add_argument("--checkpoints", type=Path,
                          help="where global models go (None: <data dir>/fl-simulation)")
    simulate.add_argument("--dp-noise", type=real(0), default=app["dp-noise-multiplier"],
                          help="central DP noise multiplier (0: off)")
    simulate.add_argument("--dp-clip", type=real(0), default=app["dp-clipping-norm"],
                          help="DP clipping norm")
    simulate.add_argument("--seed", type=int, default=app["seed"],
                          help="seed of partitioning, shuffling and scoring")
    simulate.add_argument("--workers", type=count(0), default=0,
                          help="Ray workers training the devices, each a process that loads "
                          "the models (0: one per core)")
    simulate.add_argument("--publish", action="store_true",
                          help="after the last round, publish the global model as this data "
                          "dir's FL server's newest round: `fl server` serves it and a new "
                          "user's `fl sync` installs it")
    simulate.set_defaults(handler=run_simulate)

    server = fl.add_parser("server", help="the FL server: a Flower SuperLink, and the "
                           "endpoint new users download the global model from",
                           formatter_class=formatter)
    server.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other hosts")
    server.add_argument("--port", type=port_argument, default=9093,
                        help="the SuperLink's Fleet API, for devices (nothing else is served "
                        "there)")
    server.add_argument("--control-port", type=port_argument, default=9095,
                        help="the SuperLink itself, on loopback only: `fl run` submits runs "
                        "there")
    server.add_argument("--model-port", type=port_argument, default=9100,
                        help="the global-model download endpoint's port")
    server.add_argument("--certificates", type=Path,
                        help="a directory made by deploy/make-certificates.sh, for TLS "
                        "(None: insecure)")
    server.add_argument("--supernode-auth", action="store_true",
                        help="admit only SuperNodes whose public key was registered with "
                        "`flwr supernode register` (needs --certificates)")
    server.add_argument("--app-signatures", type=Path,
                        help="the operator's app signatures (`fl sign-app --out`), handed to "
                        "SuperNodes with the app (None: <data dir>/fl-server/app-signatures)")
    server.set_defaults(handler=run_server)

    sign_app = fl.add_parser("sign-app", help="sign the Flower app `fl run` submits with the "
                             "operator's key: SuperNodes run only an app signed so",
                             formatter_class=formatter)
    sign_app.add_argument("--key", type=Path, help="the operator's Ed25519 key (OpenSSH, as "
                          "ssh-keygen -t ed25519 -N '' writes it; made on first use; None: "
                          "<data dir>/fl-operator/app-signing-key)")
    sign_app.add_argument("--out", type=Path, help="where the FL server's gateway finds the "
                          "signature (its --app-signatures; None: <data dir>/fl-server/"
                          "app-signatures)")
    sign_app.add_argument("--run-config", help="the settings devices run with and the "
                          "server's that shape what they receive (aggregation, screening, "
                          "DP, threshold tuning), signed into the app, e.g. \"epochs=2 "
                          "aggregation='median'\": give `fl run` the same ones (rounds, node "
                          "counts and timeouts here are left to `fl run`)")
    sign_app.set_defaults(handler=run_sign_app)

    run = fl.add_parser("run", help="start federated rounds on a running FL server",
                        formatter_class=formatter)
    run.add_argument("--superlink", default="127.0.0.1:9095", metavar="HOST:PORT",
                     help="the FL server's SuperLink (its --control-port, on loopback)")
    run.add_argument("--rounds", type=count(1), default=app["num-server-rounds"],
                     help="federated rounds")
    run.add_argument("--run-config", help="more settings, e.g. \"top-layers=2 "
                     "min-train-nodes=4\" (the keys and their defaults: [tool.flwr.app.config] "
                     "in meancache/fl_server/flower_app/pyproject.toml); those devices read "
                     "or that shape what they receive go into the app, which `fl sign-app "
                     "--run-config` with the same ones signed")
    run.add_argument("--root-certificate", type=Path,
                     help="the CA certificate, for TLS (None: insecure)")
    run.set_defaults(handler=run_rounds)


def split_run_config(settings: FlServerSettings, text: str | None
                     ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the settings devices read or that shape what they receive, written into the app
    and so under the operator's signature; the server's scheduling of the run, its
    overrides) of this data dir's encoder and
    ``--run-config``: `fl sign-app` and `fl run` make the same app from the same ones."""
    from meancache.fl_server.run_config import ServerConfig, parse_overrides, split_overrides
    from meancache.shared.fl.client_config import ClientConfig

    encoder = {"encoder-model": settings.encoder_model} if settings.encoder_model else {}
    device, server = split_overrides(encoder | parse_overrides(text))
    # Both sides read the whole config as the apps will (a value out of range is a
    # RunConfigError naming its key), before an app is signed or a run submitted: the
    # checkpoint dir is the ServerApp's to set, so any path stands in for it.
    whole = {**default_run_config(), "checkpoint-dir": "checked", **device, **server}
    ServerConfig.from_run_config(whole)
    ClientConfig.from_run_config(whole)
    return device, server


def run_sign_app(args: argparse.Namespace, settings: FlServerSettings) -> int:
    """Build the FAB `fl run` submits (flwr builds it byte for byte the same: fixed dates,
    sorted files), with the settings devices read, and keep the operator's signature of it
    where the gateway looks."""
    import tempfile

    from flwr.cli.build import build_fab_from_disk
    from meancache.fl_server.app_declaration import write_app
    from meancache.shared.fl.app_signing import operator_key, save_signature, sign_fab

    device, _ = split_run_config(settings, args.run_config)
    key_path = args.key or settings.data_dir / "fl-operator" / "app-signing-key"
    key = operator_key(key_path)
    with tempfile.TemporaryDirectory() as tmp:
        fab = build_fab_from_disk(write_app(Path(tmp), device))
    saved = save_signature(sign_fab(fab, key), args.out or settings.app_signature_dir)
    signed = " ".join(f"{k}={v!r}" for k, v in sorted(device.items())) or "the defaults"
    print(f"signed the app (sha256 {saved.stem}) with {key_path}, devices running {signed}: "
          f"{saved}; devices join with `fl join --app-key {key_path}.pub` (or "
          "fl_app_public_key) and run only apps signed with it", file=sys.stderr)
    return 0


def run_server(args: argparse.Namespace, settings: FlServerSettings) -> int:
    import subprocess

    from meancache.fl_server.fleet_gateway import create_gateway
    from meancache.fl_server.model_endpoint import create_model_app
    from meancache.fl_server.processes import superlink_command
    from meancache.fl_server.serving import serve
    from meancache.shared.errors import FlowerCommandError
    from meancache.shared.fl.signing import PUBLIC_KEY, server_key
    from meancache.shared.http_limits import listening_socket
    from meancache.shared.processes import exit_on_sigterm, flower_environment

    exit_on_sigterm()  # the SuperLink below stops with us
    app_signatures = args.app_signatures or settings.app_signature_dir
    if app_signatures.exists() and not app_signatures.is_dir():  # no app would be signed
        raise FlowerCommandError(f"--app-signatures {app_signatures} is not a directory: give "
                                 "the folder `fl sign-app --out` writes signatures to")
    # the ports devices reach, taken first: one in use is said before anything starts
    model_listener = listening_socket(args.host, args.model_port)
    fleet_listener = listening_socket(args.host, args.port)
    state = settings.state_dir
    state.mkdir(parents=True, exist_ok=True)
    env = flower_environment(MEANCACHE_DATA_DIR=str(settings.data_dir),
                             FLWR_HOME=str(state / "flwr-home"))  # never ~/.flwr
    superlink = subprocess.Popen(
        superlink_command(state, "127.0.0.1", args.control_port, args.certificates,
                          supernode_auth=args.supernode_auth), env=env,
        stdout=(state / "superlink.log").open("ab"), stderr=subprocess.STDOUT)
    server_key(settings.checkpoint_dir)
    scheme = "http" if args.certificates is None else "https"
    print(f"meancache fl server: Fleet API for devices on {args.host}:{args.port}, run "
          f"submission on 127.0.0.1:{args.control_port} only, global model on "
          f"{scheme}://{args.host}:{args.model_port}/v1/global-model; logs in {state}; "
          f"hand devices {settings.checkpoint_dir / PUBLIC_KEY} (`fl sync --server-key` or "
          "fl_server_public_key): they install only global models signed with it",
          file=sys.stderr, flush=True)
    ca = None if args.certificates is None else args.certificates / "ca.crt"
    try:
        serve([(create_model_app(settings.checkpoint_dir), model_listener),
               (create_gateway(f"127.0.0.1:{args.control_port}", ca, app_signatures),
                fleet_listener)],
              args.certificates)
    finally:
        superlink.terminate()
        superlink.wait(timeout=30)
    return 0


def run_rounds(args: argparse.Namespace, settings: FlServerSettings) -> int:
    """`flwr run` of the packaged Flower app (copied, stamped with this version), the
    settings devices read or that shape what they receive written into it (they reach
    devices only under the operator's signature of the app: the gateway refuses a run that
    overrides them), the server's scheduling passed as the run's overrides (a TOML file:
    any path survives)."""
    import tempfile

    import tomli_w
    from flwr.cli.build import build_fab_from_disk
    from meancache.fl_server.app_declaration import write_app
    from meancache.fl_server.processes import run_command
    from meancache.shared.fl.app_signing import find_signature
    from meancache.shared.processes import run_foreground

    device, server = split_run_config(settings, args.run_config)
    server = {"num-server-rounds": args.rounds,
              "checkpoint-dir": str(settings.checkpoint_dir)} | server
    with tempfile.TemporaryDirectory() as tmp:
        app = write_app(Path(tmp), device)
        digest = hashlib.sha256(build_fab_from_disk(app)).hexdigest()
        if find_signature(settings.app_signature_dir, digest) is None:
            print(f"warning: this app (devices running {device or 'the defaults'}) is not "
                  f"signed in {settings.app_signature_dir}: devices that run only the "
                  "operator's apps refuse it; sign it with `meancache fl sign-app` and the "
                  "same --run-config", file=sys.stderr, flush=True)
        overrides = Path(tmp) / "run-config.toml"
        overrides.write_text(tomli_w.dumps(server), encoding="utf-8")
        command, env = run_command(app, args.superlink, str(overrides),
                                   settings.data_dir / "flwr-home", args.root_certificate)
        return run_foreground(command, env)


def simulation_config(args: argparse.Namespace, settings: FlServerSettings
                      ) -> "SimulationConfig":
    """The federation `fl simulate`'s arguments ask for, or MeanCacheError naming the
    argument that cannot be run."""
    from meancache.fl_server.simulate import SimulationConfig
    from meancache.shared.errors import MeanCacheError
    from meancache.shared.pairs import read_pairs

    # read as the devices (train) and the ServerApp (dev) will: a missing or broken file is
    # named here, not as a simulation that ended after 0 rounds
    for split in ("train", "dev"):
        read_pairs(args.pairs, split=split)
    if args.per_round > args.clients:
        raise MeanCacheError(f"--per-round must lie between 1 and --clients ({args.clients}); "
                             "lower --per-round or raise --clients")
    if args.verifier_only and args.verifier_layers < 1:
        raise MeanCacheError("--verifier-only federates the verifier alone, so it needs "
                             "--verifier-layers 1 or more")
    return SimulationConfig(
        pairs=args.pairs, checkpoint_dir=args.checkpoints or settings.data_dir / "fl-simulation",
        clients=args.clients, per_round=args.per_round, workers=args.workers, run_config={
            "num-server-rounds": args.rounds, "partitioning": args.partitioning,
            "pairs-per-client": args.pairs_per_client, "top-layers": args.top_layers,
            "update-bits": args.update_bits, "update-rank": args.update_rank,
            "epochs": args.epochs,
            "verifier-top-layers": args.verifier_layers,
            "train-encoder": int(not args.verifier_only),
            "secure-aggregation": int(args.secure_aggregation),
            "secure-upload-mb": args.secure_upload_mb,
            "learning-rate": args.learning_rate,
            "encoder-model": settings.encoder_model or "",
            "held-out-pairs": args.held_out, "seed": args.seed,
            "dp-noise-multiplier": args.dp_noise, "dp-clipping-norm": args.dp_clip})


def run_simulate(args: argparse.Namespace, settings: FlServerSettings) -> int:
    from meancache.fl_server.simulate import simulate
    from meancache.shared.errors import MeanCacheError
    from meancache.shared.processes import exit_on_sigterm
    from rich.console import Console
    from rich.table import Table

    config = simulation_config(args, settings)
    exit_on_sigterm()  # the SuperLink and the run it starts stop with us
    err = Console(stderr=True, highlight=False)

    log = settings.data_dir / "flwr-simulation" / "simulation.log"

    def progress(row: dict[str, float]) -> None:
        scored = f", F0.5 {row['f05']:.3f}" if "f05" in row else ""
        failed = (f"; {int(row['failed'])} of {args.per_round} devices failed (why: {log})"
                  if row.get("failed") else "")
        err.print(f"round {int(row['round'])}/{args.rounds} done in {row['seconds']:.0f} s: "
                  f"threshold {row['threshold']:.3f}{scored}{failed}")

    rows = simulate(config, log.parent, on_round=progress)
    table = Table("round", "F0.5", "F1", "precision", "recall", "threshold",
                  "best tau", "best F0.5", "seconds", "KiB/client", "of it verifier", "failed",
                  title=f"{args.clients} clients, {args.per_round} per round, "
                        f"{args.partitioning}, {args.pairs_per_client} pairs each")
    for row in rows:
        scores = [f"{row[k]:.3f}" if k in row else "-" for k in (
            "f05", "f1", "precision", "recall", "threshold", "best_threshold", "best_f05")]
        table.add_row(str(int(row["round"])), *scores, f"{row['seconds']:.1f}",
                      f"{row.get('bytes_per_client', 0) / 1024:.0f}",
                      f"{row.get('verifier_bytes_per_client', 0) / 1024:.0f}",
                      str(int(row.get("failed", 0))))
    Console(file=sys.stdout, width=160).print(table)
    if any(row.get("failed") for row in rows) and not any(row.get("clients") for row in rows):
        raise MeanCacheError(f"no device trained in any round: each failed (why: {log}); "
                             "the global model is the one the rounds started from")
    if args.publish:
        from meancache.fl_server.publish import publish
        from meancache.shared.fl.signing import PUBLIC_KEY

        server_dir = settings.checkpoint_dir
        meta = publish(config.checkpoint_dir, server_dir)
        err.print(f"published the global model as round {meta.round} (threshold "
                  f"{meta.threshold:.3f}) in {server_dir}: `meancache fl server` serves it; "
                  f"devices install it only with {server_dir / PUBLIC_KEY} as their "
                  "`fl sync --server-key` (or fl_server_public_key)")
    return 0
