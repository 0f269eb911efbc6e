"""`meancache verifier train`: the one command that reproduces the shipped verifier;
`meancache verifier train-teacher`: the larger judge that labels data for it, resumable."""

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from meancache.shared.verifier.runtime import ARTEFACT_DIR

DEFAULT_DATA = Path("../shared/data/qqp/pairs.jsonl")


def cmd_train(args: argparse.Namespace, settings: object = None) -> int:
    """Train, export and print the dev metrics (the card it writes)."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from meancache.shared.verifier.train import TrainConfig, train

    overrides = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig)
                 if getattr(args, f.name, None) is not None}
    card = train(args.data, args.out, TrainConfig(**overrides))
    print(json.dumps({"threshold": card["threshold"], "dev": card["dev"],
                      "minutes": card["minutes"], "out": str(args.out)}, indent=2))
    return 0


TEACHER_OPTIONS = {"epochs": int, "batch": int, "learning_rate": float, "max_tokens": int,
                   "pairs": int, "generated": int, "dev_pairs": int, "seed": int}


def cmd_train_teacher(args: argparse.Namespace, settings: Any) -> int:
    """Start or resume the teacher's run; print its record's summary at the end."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.threads == 1:  # the tokenizer's own thread pool would take the other core
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from meancache.shared.errors import VerifierError
    from meancache.shared.progress_bar import ProgressBar
    from meancache.shared.verifier.teacher import RunOptions, TeacherConfig, train_teacher
    from rich.console import Console

    overrides = {name: getattr(args, name) for name in TEACHER_OPTIONS
                 if getattr(args, name) is not None}
    if args.resume and overrides:
        names = ", ".join("--" + n.replace("_", "-") for n in overrides)
        raise VerifierError(f"a resumed run keeps the settings it started with ({names} "
                            "given); drop them, or start a new run in another --out")
    for name, value in overrides.items():
        if value <= 0:
            raise VerifierError(f"--{name.replace('_', '-')} must be positive, not {value}")
    if args.threads < 1 or args.checkpoint_minutes < 0 or (
            args.stop_after is not None and args.stop_after < 1):
        raise VerifierError("--threads and --stop-after must be at least 1 and "
                            "--checkpoint-minutes not negative")
    out = args.out or settings.data_dir / "verifier" / "teacher"
    console = Console(stderr=True)
    if args.backbone is not None:
        backbone = args.backbone
    else:
        from meancache.shared.encoder.packaged import MPNET, ensure_assembled

        with ProgressBar("assembling all-mpnet-base-v2", console) as bar:
            backbone = ensure_assembled(MPNET, settings.models_dir, bar)
    options = RunOptions(threads=args.threads, checkpoint_minutes=args.checkpoint_minutes,
                         stop_after=args.stop_after)
    with ProgressBar("teacher steps", console, line_every=60.0) as bar:
        record = train_teacher(out, args.data, backbone, TeacherConfig(**overrides), options,
                               resume=args.resume, progress=bar)
    print(json.dumps({"out": str(out), "finished": record["finished"],
                      "checkpoint": record["checkpoint"], "epochs": record["epochs"]},
                     indent=2))
    return 0


def add_commands(commands: Any) -> None:
    verifier = commands.add_parser("verifier", help="the learned verifier of cache hits")
    sub = verifier.add_subparsers(dest="verifier_command", required=True)
    train = sub.add_parser("train", help="train it from the packaged MiniLM and QQP "
                           "(fixed seed; about 45 minutes on 2 cores) and print dev metrics")
    train.add_argument("--data", type=Path, default=DEFAULT_DATA,
                       help=f"QQP pairs JSONL with a split field (default: {DEFAULT_DATA})")
    train.add_argument("--out", type=Path, default=ARTEFACT_DIR,
                       help="where verifier.onnx and verifier.json go (default: the "
                       "package's own, replacing the shipped model)")
    train.add_argument("--pairs", type=int, help="QQP train pairs drawn (default: all of them)")
    train.add_argument("--generated", type=int, help="code-made hard negatives (default 10000)")
    train.add_argument("--epochs", type=int, help="passes over the examples (default 2)")
    train.add_argument("--seed", type=int, help="seed of every random choice (default 0)")
    train.set_defaults(handler=cmd_train)
    teacher = sub.add_parser(
        "train-teacher", help="train the teacher (a cross-encoder on the packaged "
        "all-mpnet-base-v2) that labels data for the verifier: hours on one core, "
        "checkpointed every few minutes, continued with --resume")
    teacher.add_argument("--resume", action="store_true",
                         help="continue the run in --out where its last checkpoint left it")
    teacher.add_argument("--out", type=Path, help="the run's directory: record, examples, "
                         "checkpoints, log (default: <data dir>/verifier/teacher)")
    teacher.add_argument("--data", type=Path, default=DEFAULT_DATA,
                         help=f"QQP pairs JSONL with a split field (default: {DEFAULT_DATA})")
    teacher.add_argument("--backbone", type=Path, help="a transformer model directory "
                         "(default: the packaged all-mpnet-base-v2, assembled into "
                         "<data dir>/models on first use)")
    teacher.add_argument("--epochs", type=int, help="passes over the examples (default 2)")
    teacher.add_argument("--batch", type=int, help="pairs per step (default 16)")
    teacher.add_argument("--learning-rate", type=float, help="peak AdamW rate (default 2e-5)")
    teacher.add_argument("--max-tokens", type=int, help="tokens per pair (default 96)")
    teacher.add_argument("--pairs", type=int, help="QQP train pairs drawn (default: all)")
    teacher.add_argument("--generated", type=int,
                         help="code-made hard negatives (default 10000)")
    teacher.add_argument("--dev-pairs", type=int,
                         help="QQP dev pairs scored after each epoch (default 4000)")
    teacher.add_argument("--seed", type=int, help="seed of every random choice (default 0)")
    teacher.add_argument("--threads", type=int, default=1,
                         help="torch threads (default 1: the other core stays free)")
    teacher.add_argument("--checkpoint-minutes", type=float, default=5.0,
                         help="minutes between checkpoints (default 5)")
    teacher.add_argument("--stop-after", type=int, metavar="STEPS",
                         help="stop (with a checkpoint) after this many steps of this run")
    teacher.set_defaults(handler=cmd_train_teacher)
