"""`meancache verifier train`: the one command that reproduces the shipped verifier."""

import argparse
import dataclasses
import os
from pathlib import Path
from typing import Any

from meancache.shared.settings import SettingsBase
from meancache.shared.verifier.runtime import ARTEFACT_DIR

DEFAULT_DATA = Path("../shared/data/qqp/pairs.jsonl")


def cmd_train(args: argparse.Namespace, settings: SettingsBase | None = None) -> int:
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
