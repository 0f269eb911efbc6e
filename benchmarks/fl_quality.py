"""Quality of the federated global model per round, against the zero-shot encoder.

Clients train the encoder on partitions of the QQP train split (Flower simulation engine,
Ray, through `flwr run` as `meancache fl simulate` does); after every round the global
model is scored on held-out dev pairs at the global threshold (tuned on the devices'
pooled similarity evidence: fl_server/pooled_threshold.py), and at its own best
threshold. Round 0 is the zero-shot encoder. Reports F0.5, F1, precision, recall,
threshold, wall time and bytes per client per round.

    python benchmarks/fl_quality.py                   # 10 clients, 4 per round, 5 rounds
    python benchmarks/fl_quality.py --quick           # tiny: 4 clients, 2 rounds
    python benchmarks/fl_quality.py --plot docs/fl_rounds.png   # and a chart
    python benchmarks/fl_quality.py --secure --secure-upload-mb 4.5   # SecAgg+, capped
"""

import tempfile
from pathlib import Path

from _common import (
    apply_defaults,
    base_parser,
    heading,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
)
from _plot import add_plot_option, line_chart
from meancache.fl_server.simulate import SimulationConfig, simulate


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--clients", type=int)
    parser.add_argument("--per-round", type=int)
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--pairs-per-client", type=int)
    parser.add_argument("--held-out", type=int)
    parser.add_argument("--top-layers", type=int, default=2)
    parser.add_argument("--update-bits", type=int, choices=(0, 8, 4), default=8,
                        help="devices send their update quantised to 8 or 4 bits (0: float32)")
    parser.add_argument("--update-rank", type=int, default=0,
                        help="each trained matrix's update as rank-R factors (0: every value)")
    parser.add_argument("--learning-rate", type=float, default=2e-5,
                        help="devices' local learning rate")
    parser.add_argument("--partitioning", choices=("iid", "topic"), default="iid")
    parser.add_argument("--encoder", help="a local sentence-transformers model (default MiniLM)")
    parser.add_argument("--verifier-layers", type=int, default=1,
                        help="the learned verifier's top layers trained and sent beside the "
                        "encoder (0: not federated; the benchmark scores the encoder)")
    parser.add_argument("--secure", action="store_true",
                        help="SecAgg+ (run config secure-aggregation; the update is then the "
                        "masked weights, not --update-bits/--update-rank)")
    parser.add_argument("--secure-upload-mb", type=float, default=0.0,
                        help="with --secure, the cap on a device's masked weights a round "
                        "(run config secure-upload-mb; 0: every entry)")
    add_plot_option(parser)
    args = apply_defaults(parser.parse_args(),
                          {"clients": 10, "per_round": 4, "rounds": 5, "pairs_per_client": 300,
                           "held_out": 1000},
                          {"clients": 4, "per_round": 2, "rounds": 2, "pairs_per_client": 60,
                           "held_out": 200})
    with tempfile.TemporaryDirectory() as tmp:
        config = SimulationConfig(
            pairs=args.data_dir / "qqp" / "pairs.jsonl", checkpoint_dir=Path(tmp) / "ckpt",
            clients=args.clients, per_round=args.per_round, run_config={
                "num-server-rounds": args.rounds, "partitioning": args.partitioning,
                "pairs-per-client": args.pairs_per_client, "top-layers": args.top_layers,
                "update-bits": args.update_bits, "update-rank": args.update_rank,
                "learning-rate": args.learning_rate,
                "encoder-model": args.encoder or "",
                "verifier-top-layers": args.verifier_layers,
                "secure-aggregation": int(args.secure),
                "secure-upload-mb": args.secure_upload_mb,
                "held-out-pairs": args.held_out,
                "seed": args.seed})
        # Flower's home (its simulation.log) outlives the run: a failed round is read there.
        home = args.cache_dir / "fl_quality" / "flwr-home"
        rows = simulate(config, home, on_round=lambda row: note(
            f"round {int(row['round'])}: F0.5 {row.get('f05', 0):.3f}, "
            f"threshold {row['threshold']:.3f}, {row['seconds']:.0f} s"))
    table = make_table(["round", "F0.5", "F1", "precision", "recall", "threshold",
                        "best tau", "F0.5 at best tau", "seconds", "MiB/client"])
    for row in rows:
        table.add_row(str(int(row["round"])), *(f"{row[k]:.3f}" for k in (
            "f05", "f1", "precision", "recall", "threshold", "best_threshold", "best_f05")),
            f"{row['seconds']:.1f}", f"{row.get('bytes_per_client', 0) / 2**20:.2f}")
    cap = f"at most {args.secure_upload_mb:g} MB" if args.secure_upload_mb else "every entry"
    sent = (f"SecAgg+, {cap}" if args.secure else f"{args.update_bits or 32}-bit"
            f"{f', rank {args.update_rank}' if args.update_rank and args.update_bits else ''}")
    setup = (f"{args.clients} clients, {args.per_round} per round, {args.pairs_per_client} "
             f"{args.partitioning} train pairs each, top {args.top_layers} layers "
             f"(verifier: {args.verifier_layers}) trained and sent ({sent}), learning rate "
             f"{args.learning_rate:g}; scored on {args.held_out} dev pairs")
    heading(f"Federated rounds: {setup} (round 0 = zero-shot)")
    print_table(table)
    if args.plot:
        rounds = [int(row["round"]) for row in rows]
        line_chart(args.plot, "Federated learning: F0.5 of the global model per round",
                   "round (0 = the zero-shot encoder)", "F0.5 on held-out QQP dev pairs", {
                       "at the shipped (pooled) threshold": (rounds, [r["f05"] for r in rows]),
                       "at its best threshold": (rounds, [r["best_f05"] for r in rows])},
                   subtitle=setup)
    print_command()
    note(machine_load())


if __name__ == "__main__":
    main()
