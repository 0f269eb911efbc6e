"""`meancache fl simulate|server|run`: the FL server's commands."""

import argparse
import logging
import sys
from pathlib import Path
from typing import Any

DEFAULT_PAIRS = Path(__file__).resolve().parents[1].parent / "shared/data/qqp/pairs.jsonl"


def add_commands(fl: Any) -> None:
    simulate = fl.add_parser("simulate", help="federated rounds on the simulation engine")
    simulate.add_argument("--clients", type=int, default=20)
    simulate.add_argument("--per-round", type=int, default=4)
    simulate.add_argument("--rounds", type=int, default=3)
    simulate.add_argument("--pairs", type=Path, default=DEFAULT_PAIRS,
                          help="labelled pairs JSONL (train split partitioned, dev held out)")
    simulate.add_argument("--partitioning", choices=("iid", "topic"), default="iid")
    simulate.add_argument("--pairs-per-client", type=int, default=200)
    simulate.add_argument("--top-layers", type=int, default=2,
                          help="train and send only the top N transformer layers (0: all)")
    simulate.add_argument("--epochs", type=int, default=1)
    simulate.add_argument("--held-out", type=int, default=1000,
                          help="dev pairs the global model is scored on each round")
    simulate.add_argument("--checkpoints", type=Path,
                          help="where global models go (default: <data dir>/fl-simulation)")
    simulate.add_argument("--dp-noise", type=float, default=0.0,
                          help="central DP noise multiplier (0: off)")
    simulate.add_argument("--dp-clip", type=float, default=1.0, help="DP clipping norm")
    simulate.add_argument("--seed", type=int, default=0)
    simulate.set_defaults(handler=run_simulate)

    server = fl.add_parser("server", help="the FL server: a Flower SuperLink, and the "
                           "endpoint new users download the global model from")
    server.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to accept other hosts")
    server.add_argument("--port", type=int, default=9093, help="the SuperLink's port")
    server.add_argument("--model-port", type=int, default=9100,
                        help="the global-model download endpoint's port")
    server.add_argument("--certificates", type=Path,
                        help="a directory made by deploy/make-certificates.sh (TLS)")
    server.set_defaults(handler=run_server)

    run = fl.add_parser("run", help="start federated rounds on a running FL server")
    run.add_argument("--superlink", default="127.0.0.1:9093", metavar="HOST:PORT")
    run.add_argument("--rounds", type=int, default=3)
    run.add_argument("--run-config", default="",
                     help="more settings, e.g. \"top-layers=2 min-train-nodes=4\"")
    run.add_argument("--root-certificate", type=Path, help="the CA certificate (TLS)")
    run.set_defaults(handler=run_rounds)


def checkpoint_dir(settings: Any) -> Path:
    return settings.data_dir / "fl-server" / "checkpoints"


def run_server(args: argparse.Namespace, settings: Any) -> int:
    import subprocess

    from meancache.fl_server.model_endpoint import serve_model
    from meancache.fl_server.processes import flower_environment, superlink_command

    state = settings.data_dir / "fl-server"
    state.mkdir(parents=True, exist_ok=True)
    env = flower_environment(MEANCACHE_DATA_DIR=str(settings.data_dir))
    superlink = subprocess.Popen(
        superlink_command(state, args.host, args.port, args.certificates), env=env,
        stdout=(state / "superlink.log").open("ab"), stderr=subprocess.STDOUT)
    print(f"meancache fl server: SuperLink on {args.host}:{args.port}, global model on "
          f"http://{args.host}:{args.model_port}/v1/global-model; logs in {state}",
          file=sys.stderr, flush=True)
    try:
        serve_model(checkpoint_dir(settings), args.host, args.model_port)
    finally:
        superlink.terminate()
        superlink.wait(timeout=30)
    return 0


def run_rounds(args: argparse.Namespace, settings: Any) -> int:
    from meancache.fl_server.processes import run_command, run_foreground

    config = f"num-server-rounds={args.rounds} checkpoint-dir='{checkpoint_dir(settings)}'"
    if settings.encoder_model:
        config += f" encoder-model='{settings.encoder_model}'"
    command, env = run_command(args.superlink, f"{config} {args.run_config}".strip(),
                               settings.data_dir / "flwr-home", args.root_certificate)
    return run_foreground(command, env)


def run_simulate(args: argparse.Namespace, settings: Any) -> int:
    from meancache.fl_server.simulate import SimulationConfig, simulate
    from meancache.shared.errors import MeanCacheError
    from rich.console import Console
    from rich.table import Table

    if not args.pairs.is_file():
        raise MeanCacheError(f"no labelled pairs at {args.pairs} (pass --pairs FILE)")
    if not 0 < args.per_round <= args.clients:
        raise MeanCacheError("--per-round must lie between 1 and --clients")
    logging.getLogger("flwr").setLevel(logging.WARNING)
    config = SimulationConfig(
        pairs=args.pairs, checkpoint_dir=args.checkpoints or settings.data_dir / "fl-simulation",
        clients=args.clients, per_round=args.per_round, rounds=args.rounds,
        partitioning=args.partitioning, pairs_per_client=args.pairs_per_client,
        top_layers=args.top_layers, epochs=args.epochs, encoder_model=settings.encoder_model,
        held_out=args.held_out, seed=args.seed, dp_noise_multiplier=args.dp_noise,
        dp_clipping_norm=args.dp_clip,
    )
    err = Console(stderr=True, highlight=False)

    def progress(row: dict[str, float]) -> None:
        scored = f", F0.5 {row['f05']:.3f}" if "f05" in row else ""
        err.print(f"round {int(row['round'])}/{args.rounds} done in {row['seconds']:.0f} s: "
                  f"threshold {row['threshold']:.3f}{scored}")

    rows = simulate(config, on_round=progress)
    table = Table("round", "F0.5", "F1", "precision", "recall", "threshold",
                  "best tau", "best F0.5", "seconds", "KiB/client",
                  title=f"{args.clients} clients, {args.per_round} per round, "
                        f"{args.partitioning}, {args.pairs_per_client} pairs each")
    for row in rows:
        scores = [f"{row[k]:.3f}" if k in row else "-" for k in (
            "f05", "f1", "precision", "recall", "threshold", "best_threshold", "best_f05")]
        table.add_row(str(int(row["round"])), *scores, f"{row['seconds']:.1f}",
                      f"{row.get('bytes_per_client', 0) / 1024:.0f}")
    Console(file=sys.stdout, width=160).print(table)
    return 0
