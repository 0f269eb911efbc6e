"""Could the teacher itself judge at lookup? Its cost per pair beside the shipped student's
and the embedding's, measured in one process, interleaved pair by pair (issue 35, part 1:
"if the teacher itself is the best judge within the lookup budget, for example only the
top 2 candidates scored, it may ship: measure both").

Each QQP dev pair (a seeded sample) is scored alone by the teacher (PyTorch, float32 and,
where the CPU multiplies bfloat16 natively, bfloat16; with --int8 its int8 ONNX export),
by the shipped student (int8 ONNX, as a lookup scores a candidate) and its first question
embedded by the default encoder (MPNet, int8 ONNX), one after another, so that the
machine's load falls on all alike. The table gives each one's p50 and p99, and the whole
lookup it implies with the top 2 candidates scored: the embedding plus two pairs (the
index search and the rest are under a millisecond).

    python benchmarks/teacher_latency.py --run /work/teacher-run
    python benchmarks/teacher_latency.py --run RUN --checkpoint RUN/checkpoint-0002655.pt
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from _common import (
    Latency,
    base_parser,
    load_encoder,
    load_qqp,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
    sample,
)
from cascade_study import Int8Teacher
from meancache.shared.encoder.packaged import MPNET, ensure_assembled
from meancache.shared.verifier.runtime import LearnedVerifier
from meancache.shared.verifier.teacher import TeacherConfig, load_provisional, load_teacher
from meancache.shared.verifier.train import bfloat16_matmuls
from meancache.shared.verifier.training_run import pair_probabilities

TOP = 2  # candidates the teacher would score at lookup


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--run", type=Path, required=True, help="the teacher's run directory")
    parser.add_argument("--epoch", type=int, help="its epoch (default: the chosen one)")
    parser.add_argument("--checkpoint", type=Path,
                        help="a training checkpoint's weights instead (while no epoch is done)")
    parser.add_argument("--int8", type=Path,
                        help="also the teacher's int8 ONNX export (cascade_study.py writes it "
                        "to --work/teacher-int8-<weights>/verifier.onnx), each pair alone")
    parser.add_argument("--pairs", type=int, default=200, help="QQP dev pairs timed")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads for the teacher (the encoder's session uses 2)")
    args = parser.parse_args()
    if args.quick:
        args.pairs = 20
    torch.set_num_threads(args.threads)
    backbone = ensure_assembled(MPNET, args.cache_dir / "models")
    model, record, _ = (load_provisional(args.run, backbone, args.checkpoint)
                        if args.checkpoint else load_teacher(args.run, backbone, args.epoch))
    max_tokens = TeacherConfig(**record["config"]).max_tokens
    student = LearnedVerifier.load()
    encoder = load_encoder("onnx", args.cache_dir, model="mpnet")
    pairs = sample(load_qqp(args.data_dir, "dev"), args.pairs, args.seed)
    tokenizer = backbone / "tokenizer.json"
    judges = {"teacher, float32": lambda a, b: pair_probabilities(
        model, [a], [b], max_tokens, tokenizer, False)}
    if bfloat16_matmuls():
        judges["teacher, bfloat16"] = lambda a, b: pair_probabilities(
            model, [a], [b], max_tokens, tokenizer, True)
    if args.int8:
        judges["teacher, int8 ONNX"] = Int8Teacher(args.int8, max_tokens, tokenizer).probability
    judges["student (shipped, int8 ONNX)"] = lambda a, b: student.pair_probabilities([a], [b])
    timings: dict[str, list[float]] = {name: [] for name in [*judges, "embedding (MPNet)"]}
    for warm in pairs[:3]:
        for judge in judges.values():
            judge(warm.q1, warm.q2)
        encoder.encode([warm.q1])
    note(f"timing {len(pairs)} pairs; {machine_load()}")
    for pair in pairs:
        for name, judge in judges.items():
            started = time.perf_counter()
            judge(pair.q1, pair.q2)
            timings[name].append(time.perf_counter() - started)
        started = time.perf_counter()
        encoder.encode([pair.q1])
        timings["embedding (MPNet)"].append(time.perf_counter() - started)
    latency = {name: Latency.of(seconds) for name, seconds in timings.items()}
    embed = latency["embedding (MPNet)"].p50
    table = make_table(["scorer", "p50 ms", "p99 ms", f"lookup p50 with top {TOP}, ms",
                        "x student"])
    student_p50 = latency["student (shipped, int8 ONNX)"].p50
    for name, lat in latency.items():
        judged = name != "embedding (MPNet)"
        table.add_row(name, f"{lat.p50:.1f}", f"{lat.p99:.1f}",
                      f"{embed + TOP * lat.p50:.1f}" if judged else "-",
                      f"{lat.p50 / student_p50:.1f}" if judged else "-")
    print_command()
    print_table(table)
    note(f"after: {machine_load()}")


if __name__ == "__main__":
    main()
