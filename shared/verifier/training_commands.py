"""`meancache verifier train`: the recipe alone, no teacher (the verifier shipped until
27 November 2026);
`meancache verifier train-teacher`: the larger judge that labels data for it, resumable;
`meancache verifier distil`: the verifier distilled from it, resumable (the shipped one);
`meancache verifier mine-pairs`: the unlabelled pairs it labels;
`meancache verifier label-pairs`: its labels on them;
`meancache verifier pack-labels` / `restore-labels`: those labels committed by reference to
the shared data's texts, and restored from it byte for byte;
`meancache verifier make-paraphrases`: pairs written by the packaged language models, and
the filter that keeps those the embedding and the teacher agree on."""

import argparse
import dataclasses
import os
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meancache.shared.arguments import count, real
from meancache.shared.settings import SettingsBase
from meancache.shared.verifier.runtime import ARTEFACT_DIR

DEFAULT_DATA = Path("../shared/data/qqp/pairs.jsonl")
# The encoder runtime the device runs by default (the client's encoder_backend): the
# cosines mine-pairs and make-paraphrases band by are those the cache decides on. The
# shared side has no backend setting of its own.
ENCODER_BACKEND = "onnx-int8"

if TYPE_CHECKING:  # torch behind it: imported when a command runs, not for --help
    from meancache.shared.verifier.training_run import Run, RunOptions

# Gemma 3 270M's loader (the upstream's, handed in by meancache.cli: the shared layer
# never imports a side): the data dir -> (model, tokenizer).
GemmaLoader = Callable[[Path], tuple[Any, Any]]


def _data_root_option(parser: argparse.ArgumentParser) -> None:
    """``--data-root``: where the commands that read every question set find them."""
    parser.add_argument("--data-root", type=Path, default=DEFAULT_DATA.parents[1],
                        help="the shared data the questions are read from (default: "
                        f"{DEFAULT_DATA.parents[1]})")


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


RUN_OPTIONS = {"epochs": int, "batch": int, "learning_rate": float, "max_tokens": int,
               "pairs": int, "generated": int, "dev_pairs": int, "seed": int}


def _run_settings(args: argparse.Namespace, run: "Run"
                  ) -> tuple[dict[str, Any], "RunOptions"]:
    """A run's config overrides and this invocation's options, checked, for train-teacher
    and distil alike. A resumed run keeps its own config: an option that repeats the
    recorded value is accepted (the command that started the run, with ``--resume``,
    continues it), one that differs is refused, naming both values."""
    from meancache.shared.errors import VerifierError
    from meancache.shared.verifier.train import check_device
    from meancache.shared.verifier.training_run import RunOptions

    check_device(args.device)
    if args.threads == 1:  # the tokenizer's own thread pool would take the other core
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    overrides = {name: getattr(args, name) for name in RUN_OPTIONS
                 if getattr(args, name) is not None}
    if args.resume:  # read whatever the options: a run not there to resume is named now
        recorded = run.read_record().get("config", {})
        if changed := {n: v for n, v in overrides.items() if recorded.get(n) != v}:
            names = ", ".join(f"--{n.replace('_', '-')} {v} (the run has "
                              f"{recorded.get(n, 'its default')})"
                              for n, v in changed.items())
            raise VerifierError(f"a resumed run keeps the settings it started with: {names}; "
                                "drop them, or start a new run in another --out")
        overrides = {}
    return overrides, RunOptions(threads=args.threads, device=args.device,
                                 checkpoint_minutes=args.checkpoint_minutes,
                                 stop_after=args.stop_after)


def _summary(out: Path, record: dict) -> str:
    import json

    return json.dumps({"out": str(out), "finished": record["finished"],
                       "checkpoint": record["checkpoint"], "epochs": record["epochs"],
                       **({"card": record["card"]} if "card" in record else {})}, indent=2)


def cmd_train_teacher(args: argparse.Namespace, settings: SettingsBase) -> int:
    """Start or resume the teacher's run; print its record's summary at the end."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from meancache.shared.pairs import read_pairs
    from meancache.shared.progress_bar import ProgressBar
    from meancache.shared.verifier.teacher import TeacherConfig, train_teacher
    from meancache.shared.verifier.training_run import Run
    from rich.console import Console

    out = args.out or settings.data_dir / "verifier" / "teacher"
    # a run that is not there to resume, or a missing or broken data file, is named
    # before MPNet is assembled
    overrides, options = _run_settings(args, Run(out, "teacher"))
    read_pairs(args.data, split="train")
    console = Console(stderr=True)
    backbone = args.backbone or _packaged_mpnet(settings, console)
    with ProgressBar("teacher steps", console, line_every=60.0) as bar:
        record = train_teacher(out, args.data, backbone, TeacherConfig(**overrides), options,
                               resume=args.resume, progress=bar)
    print(_summary(out, record))
    return 0


def cmd_distil(args: argparse.Namespace, settings: SettingsBase) -> int:
    """Start or resume the student's run; once done, export it and print its card."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from meancache.shared.encoder import packaged_minilm_dir
    from meancache.shared.progress_bar import ProgressBar
    from meancache.shared.verifier.distil import StudentConfig, distil
    from meancache.shared.verifier.training_run import Run
    from rich.console import Console

    out = args.out or settings.data_dir / "verifier" / "student"
    overrides, options = _run_settings(args, Run(out, "student"))
    with ProgressBar("student steps", Console(stderr=True), line_every=60.0) as bar:
        record = distil(out, args.data, args.labels or [],
                        args.backbone or packaged_minilm_dir(), args.artefact,
                        StudentConfig(**overrides), options, resume=args.resume,
                        progress=bar)
    print(_summary(out, record))
    return 0


# found from this checkout, not from the working directory: a run started elsewhere (with
# --data-root) would otherwise mine the held-out sets' questions without a word
_CHECKOUT = Path(__file__).resolve().parents[2]
HELD_OUT = (_CHECKOUT / "tests/data/near_miss.jsonl",
            _CHECKOUT / "benchmarks/data/near_miss_heldout.jsonl")


def cmd_mine_pairs(args: argparse.Namespace, settings: SettingsBase) -> int:
    """Pair the shared sets' questions by the MPNet embedding; print the counts."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from meancache.shared.encoder import Encoder
    from meancache.shared.progress_bar import ProgressBar
    from meancache.shared.verifier.mine import mine_pairs, question_sets
    from rich.console import Console

    exclude = _exclude(args)
    question_sets(args.data_root, args.max_chars, exclude)  # named before MPNet is assembled
    console = Console(stderr=True)
    encoder = Encoder.load(_packaged_mpnet(settings, console), backend=ENCODER_BACKEND,
                           cache_dir=settings.encoder_dir)
    with ProgressBar("embedding questions (checkpointed)", console,
                     line_every=60.0) as progress:
        summary = mine_pairs(args.data_root, args.out, encoder.encode,
                             f"{encoder.version} {encoder.backend}", low=args.low,
                             per_question=args.per_question, limit=args.pairs,
                             max_chars=args.max_chars, seed=args.seed, exclude=exclude,
                             per_source=args.per_source, progress=progress)
    print(json.dumps({"out": str(args.out), **summary}, indent=2))
    return 0


def _exclude(args: argparse.Namespace) -> tuple[Path, ...]:
    """--exclude's files, or the repo's near-miss sets, those this install has (a wheel has
    none: said on stderr, and the summary lists what was excluded)."""
    if args.exclude is not None:
        return tuple(args.exclude)
    if missing := [str(p) for p in HELD_OUT if not p.is_file()]:
        print(f"warning: the repo's near-miss sets are not here ({', '.join(missing)}): their "
              "questions are not left out; name them with --exclude", file=sys.stderr)
    return tuple(p for p in HELD_OUT if p.is_file())


def cmd_make_paraphrases(args: argparse.Namespace, settings: SettingsBase) -> int:
    """Rephrase a sample with one model (continuing a run in --out), then with --judge
    score every pair of the file; print the counts. ``args.load_gemma`` is the
    upstream's Gemma loader (``GemmaLoader``)."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from meancache.shared.progress_bar import ProgressBar
    from meancache.shared.verifier.paraphrase import LanguageModel, Settings, make_paraphrases
    from rich.console import Console

    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    result: dict[str, Any] = {"out": str(args.out)}
    if args.limit > 0:
        if args.model == "smollm2":
            from meancache.shared.verifier.smollm2 import load_smollm2

            lm = load_smollm2()
        else:
            lm = LanguageModel("gemma", *args.load_gemma(settings.data_dir), chat=False)
        options = Settings(kind="statement" if args.statements else "paraphrase",
                           limit=args.limit, seed=args.seed, max_chars=args.max_chars,
                           max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                           batch=args.batch)
        with ProgressBar(f"{args.model}: {options.kind} questions", console,
                         line_every=30.0) as bar:
            summary = make_paraphrases(args.data_root, args.out, lm, options, _exclude(args),
                                       bar)
        del lm
        result |= {"run": summary["runs"][-1], "counts": summary["counts"]}
    if args.judge:
        result["judged"] = _judge_paraphrases(args, settings, console)
    print(json.dumps(result, indent=2, ensure_ascii=False))
    return 0


def _judge_paraphrases(args: argparse.Namespace, settings: SettingsBase,
                       console: Any) -> dict:
    """--judge: the MPNet embedding's cosines and the teacher's probabilities (from an
    epoch, a provisional --checkpoint, or none with --no-teacher) on every pair."""
    from meancache.shared.encoder import Encoder
    from meancache.shared.verifier.paraphrase_judge import judge
    from meancache.shared.verifier.teacher import (
        TeacherConfig,
        load_provisional,
        load_teacher,
        pair_probabilities,
    )
    from meancache.shared.verifier.train import bfloat16_matmuls

    backbone = args.backbone or _packaged_mpnet(settings, console)
    encoder = Encoder.load(backbone, backend=ENCODER_BACKEND,
                           cache_dir=settings.encoder_dir)
    scores, record = None, None
    if not args.no_teacher:
        run = args.run or settings.data_dir / "verifier" / "teacher"
        model, run_record, entry = (load_provisional(run, backbone, args.checkpoint)
                                    if args.checkpoint else
                                    load_teacher(run, backbone, args.epoch))
        config = TeacherConfig(**run_record["config"])
        bf16 = config.bfloat16 and bfloat16_matmuls()
        scores = partial(pair_probabilities, model, max_tokens=config.max_tokens,
                         tokenizer=backbone / "tokenizer.json", bf16=bf16)
        record = {"run": str(run), "bfloat16": bf16,
                  **{k: v for k, v in entry.items() if k != "dev"}}
    return judge(args.out, encoder.encode, scores, record, seed=args.seed)


def cmd_label_pairs(args: argparse.Namespace, settings: SettingsBase) -> int:
    """The teacher's probability on each pair of a JSONL; print the summary."""
    import json

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from meancache.shared.progress_bar import ProgressBar
    from meancache.shared.verifier.label import label_pairs
    from meancache.shared.verifier.rows import read_rows
    from meancache.shared.verifier.teacher import teacher_epoch
    from meancache.shared.verifier.train import check_device
    from rich.console import Console

    # a broken file, a run with no epoch to label with, or no GPU for --device cuda, named
    # before MPNet is assembled
    check_device(args.device)
    read_rows(args.pairs, ("q1", "q2"))
    run = args.run or settings.data_dir / "verifier" / "teacher"
    teacher_epoch(run, args.epoch)
    torch.set_num_threads(args.threads)
    console = Console(stderr=True)
    backbone = args.backbone or _packaged_mpnet(settings, console)
    with ProgressBar("labelling pairs (checkpointed)", console, line_every=60.0) as bar:
        summary = label_pairs(run, backbone, args.pairs, args.out, args.epoch, progress=bar,
                              limit=args.limit, device=args.device)
    print(json.dumps({"out": str(args.out), **summary}, indent=2))
    return 0


def cmd_pack_labels(args: argparse.Namespace, settings: SettingsBase) -> int:
    """A label-pairs file by reference to the shared data; print its summary's counts."""
    import json

    from meancache.shared.verifier.label_refs import pack

    record = pack(args.labels, args.out, args.data_root)
    print(json.dumps({"out": str(args.out), "labels": record["labels"],
                      "texts": record["texts"]}, indent=2))
    return 0


def cmd_restore_labels(args: argparse.Namespace, settings: SettingsBase) -> int:
    """The labels file a pack-labels file stands for, checked by its sha256."""
    import json

    from meancache.shared.verifier.label_refs import restore

    record = restore(args.refs, args.out, args.data_root)
    print(json.dumps({"out": str(args.out), **record["labels"]}, indent=2))
    return 0


def _packaged_mpnet(settings: SettingsBase, console: object) -> Path:
    """all-mpnet-base-v2, assembled into the data dir's models on first use."""
    from meancache.shared.encoder.packaged import MPNET, ensure_assembled
    from meancache.shared.progress_bar import ProgressBar

    with ProgressBar("assembling all-mpnet-base-v2", console) as bar:
        return ensure_assembled(MPNET, settings.models_dir, bar)


def _add_run_arguments(parser: argparse.ArgumentParser, what: str, backbone: str,
                       threads: int) -> None:
    """The options of a resumable training run (``training_run``), with ``what``'s
    defaults."""
    from meancache.shared.verifier.distil import StudentConfig
    from meancache.shared.verifier.teacher import TeacherConfig

    config = TeacherConfig() if what == "teacher" else StudentConfig()
    parser.add_argument("--resume", action="store_true",
                        help="continue the run in --out where its last checkpoint left it, "
                        "with its own settings (repeating them is accepted, changing them "
                        "refused)")
    parser.add_argument("--out", type=Path, help="the run's directory: record, examples, "
                        f"checkpoints, log (default: <data dir>/verifier/{what})")
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help=f"QQP pairs JSONL with a split field (default: {DEFAULT_DATA})")
    parser.add_argument("--backbone", type=Path,
                        help=f"a transformer model directory (default: {backbone})")
    parser.add_argument("--epochs", type=count(1),
                        help=f"passes over the examples (default {config.epochs})")
    parser.add_argument("--batch", type=count(1),
                        help=f"pairs per step (default {config.batch})")
    parser.add_argument("--learning-rate", type=real(above=0.0),
                        help=f"peak AdamW rate (default {config.learning_rate:g})")
    parser.add_argument("--max-tokens", type=count(1),
                        help=f"tokens per pair (default {config.max_tokens})")
    parser.add_argument("--pairs", type=count(1), help="QQP train pairs drawn (default: all)")
    parser.add_argument("--generated", type=count(0),
                        help=f"code-made hard negatives (default {config.generated})")
    parser.add_argument("--dev-pairs", type=count(1), help="QQP dev pairs scored after each "
                        f"epoch (default {config.dev_pairs})")
    parser.add_argument("--seed", type=count(0),
                        help=f"seed of every random choice (default {config.seed})")
    parser.add_argument("--threads", type=count(1), default=threads,
                        help=f"torch threads (default {threads})")
    _device_option(parser)
    parser.add_argument("--checkpoint-minutes", type=real(0.0), default=5.0,
                        help="minutes between checkpoints (default 5)")
    parser.add_argument("--stop-after", type=count(1), metavar="STEPS",
                        help="stop (with a checkpoint) after this many steps of this run")


def _device_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                        help="where torch runs the model: cpu, or cuda where this torch sees "
                        "a GPU (default: cpu)")


def add_commands(commands: Any, load_gemma: GemmaLoader) -> None:
    verifier = commands.add_parser("verifier", help="the learned verifier of cache hits")
    sub = verifier.add_subparsers(dest="verifier_command", required=True)
    train = sub.add_parser("train", help="train it from the packaged MiniLM and QQP "
                           "(fixed seed; about 45 minutes on 2 cores) and print dev metrics")
    train.add_argument("--data", type=Path, default=DEFAULT_DATA,
                       help=f"QQP pairs JSONL with a split field (default: {DEFAULT_DATA})")
    train.add_argument("--out", type=Path, default=ARTEFACT_DIR,
                       help="where verifier.onnx and verifier.json go (default: the "
                       "package's own, replacing the shipped model)")
    train.add_argument("--pairs", type=count(1),
                       help="QQP train pairs drawn (default: all of them)")
    train.add_argument("--generated", type=count(0),
                       help="code-made hard negatives (default 10000)")
    train.add_argument("--epochs", type=count(1), help="passes over the examples (default 2)")
    train.add_argument("--seed", type=count(0), help="seed of every random choice (default 0)")
    train.set_defaults(handler=cmd_train)
    teacher = sub.add_parser(
        "train-teacher", help="train the teacher (a cross-encoder on the packaged "
        "all-mpnet-base-v2) that labels data for the verifier: hours on one core, "
        "checkpointed every few minutes, continued with --resume")
    _add_run_arguments(teacher, "teacher", "the packaged all-mpnet-base-v2, assembled into "
                       "<data dir>/models on first use", threads=1)
    teacher.set_defaults(handler=cmd_train_teacher)
    student = sub.add_parser(
        "distil", help="distil the verifier a device runs (the packaged MiniLM) from the "
        "teacher: QQP and the code-made pairs with their labels, and the pairs the teacher "
        "labelled (--labels) with its probabilities; checkpointed, continued with --resume; "
        "at the end exported to int8 ONNX with its card")
    student.add_argument("--labels", type=Path, action="append",
                         help="a label-pairs JSONL or a make-paraphrases .judged.jsonl, all "
                         "from one teacher's weights (repeatable) (default: none, QQP and "
                         "the code-made pairs alone; with --resume, the run's own)")
    student.add_argument("--artefact", type=Path, default=ARTEFACT_DIR,
                         help="where verifier.onnx and verifier.json go (default: the "
                         "package's own, replacing the shipped model)")
    _add_run_arguments(student, "student", "the packaged all-MiniLM-L6-v2", threads=2)
    student.set_defaults(handler=cmd_distil)
    mine = sub.add_parser(
        "mine-pairs", help="pair the questions of every set in ../shared/data by the MPNet "
        "embedding, in the band where the cache decides, for the teacher to label (JSONL "
        "with a seeded train/choose/test split); the embeddings are checkpointed, and a "
        "rerun resumes them")
    mine.add_argument("--out", type=Path, required=True, help="the pairs' JSONL (a summary "
                      "goes beside it, .json, and the embeddings' shards in "
                      "<name>.embeddings/)")
    _data_root_option(mine)
    mine.add_argument("--low", type=real(above=0.0, maximum=1.0), default=0.776,
                      help="the band's lowest cosine (default 0.776, the recall tau)")
    mine.add_argument("--per-question", type=count(1), default=2,
                      help="nearest neighbours kept per question (default 2)")
    mine.add_argument("--pairs", type=count(1), default=50_000,
                      help="pairs kept at most, a seeded sample (default 50000)")
    mine.add_argument("--max-chars", type=count(1), default=300,
                      help="longer texts are not paired (default 300)")
    mine.add_argument("--per-source", type=count(1), help="questions of each source at most (QQP "
                      "train, arena, sharegpt, contextual), a seeded sample that any larger "
                      "cap's holds (default: all of them)")
    mine.add_argument("--seed", type=count(0), default=0, help="the sample's and the split's seed")
    mine.add_argument("--exclude", type=Path, action="append",
                      help="a pairs JSONL whose questions are never mined (repeatable; "
                      "default: the repo's near-miss sets, tests/data and benchmarks/data)")
    mine.set_defaults(handler=cmd_mine_pairs)
    label = sub.add_parser("label-pairs", help="the teacher's probability on each pair of a "
                           "JSONL (mined pairs): the student's soft labels; labelled in "
                           "chunks kept in <out name>.progress.jsonl, which a rerun "
                           "continues from")
    label.add_argument("--pairs", type=Path, required=True, help="JSONL rows with q1 and q2")
    label.add_argument("--out", type=Path, required=True, help="the rows with a 'teacher' "
                       "field (a summary goes beside it, .json)")
    label.add_argument("--run", type=Path, help="the teacher's run directory (default: "
                       "<data dir>/verifier/teacher)")
    label.add_argument("--epoch", type=int, help="whose weights (default: the epoch chosen "
                       "on dev-a, or the last one scored)")
    label.add_argument("--backbone", type=Path, help="the run's backbone (default: the "
                       "packaged all-mpnet-base-v2)")
    label.add_argument("--limit", type=count(1), help="label the first rows only (mine-pairs "
                       "writes them in a seeded order: a sample) (default: every row)")
    label.add_argument("--threads", type=count(1), default=1, help="torch threads (default 1)")
    _device_option(label)
    label.set_defaults(handler=cmd_label_pairs)
    pack = sub.add_parser("pack-labels", help="a label-pairs file with each question "
                          "replaced by its text's sha256, to be committed without the shared "
                          "data's texts (refused unless every text is in --data-root)")
    pack.add_argument("--labels", type=Path, required=True, help="a label-pairs JSONL (its "
                      "summary, .json, beside it)")
    pack.add_argument("--out", type=Path, required=True, help="the rows by reference, JSONL "
                      "(a summary goes beside it, .json: the labels' sha256 and rows, "
                      "the label-pairs summary with the teacher's weights)")
    _data_root_option(pack)
    pack.set_defaults(handler=cmd_pack_labels)
    restore = sub.add_parser("restore-labels", help="the label-pairs file a pack-labels file "
                             "stands for, its texts found again in --data-root, written "
                             "only if its sha256 is the recorded one")
    restore.add_argument("--refs", type=Path, required=True, help="a pack-labels JSONL (its "
                         "summary, .json, beside it)")
    restore.add_argument("--out", type=Path, required=True, help="the labels JSONL for "
                         "distil --labels (its label-pairs summary goes beside it, .json)")
    _data_root_option(restore)
    restore.set_defaults(handler=cmd_restore_labels)
    paraphrases = sub.add_parser(
        "make-paraphrases", help="rephrase a seeded sample of Arena and ShareGPT first turns "
        "with a packaged language model (JSONL pairs with a seeded train/choose/test split; "
        "rerun to continue), and with --judge keep those the embedding and the teacher "
        "agree on")
    paraphrases.add_argument("--out", type=Path, required=True, help="the kept pairs' JSONL "
                             "(appended to; rejections go to .rejected.jsonl, counts to "
                             ".json, --judge's verdicts to .judged.jsonl and .judged.json)")
    paraphrases.add_argument("--model", choices=("gemma", "smollm2"), default="gemma",
                             help="Gemma 3 270M (few-shot) or SmolLM2-135M-Instruct (its "
                             "chat template; the paraphrase extra) (default: gemma)")
    paraphrases.add_argument("--statements", action="store_true",
                             help="turn questions into declarative sentences and rephrase "
                             "those (default: rephrase the first turns themselves)")
    paraphrases.add_argument("--limit", type=count(0), default=100, help="first turns in the "
                             "seeded sample; 0 makes none (with --judge: judge the file) "
                             "(default: 100)")
    paraphrases.add_argument("--seed", type=count(0), default=0,
                             help="the sample's, the sampling's and the split's seed "
                             "(default: 0)")
    paraphrases.add_argument("--temperature", type=real(0.0), default=0.7,
                             help="sampling temperature; 0 decodes greedily (default: 0.7)")
    paraphrases.add_argument("--max-new-tokens", type=count(1), default=64,
                             help="the cap on each output (default: 64)")
    paraphrases.add_argument("--batch", type=count(1), default=8,
                             help="prompts generated together (default: 8)")
    paraphrases.add_argument("--max-chars", type=count(1), default=300,
                             help="longer first turns are not sampled (default: 300, "
                             "mine-pairs' cap)")
    _data_root_option(paraphrases)
    paraphrases.add_argument("--exclude", type=Path, action="append",
                             help="a pairs JSONL whose questions are never sampled "
                             "(repeatable; default: the repo's near-miss sets)")
    paraphrases.add_argument("--threads", type=count(1), default=1,
                             help="torch threads (default: 1)")
    paraphrases.add_argument("--judge", action="store_true",
                             help="then score every pair of --out: kept where the MPNet "
                             "cosine is at least the recall tau 0.776 and the teacher's "
                             "probability at least 0.5 (default: off)")
    paraphrases.add_argument("--run", type=Path, help="the teacher's run directory "
                             "(default: <data dir>/verifier/teacher)")
    paraphrases.add_argument("--epoch", type=int, help="the teacher's epoch (default: the "
                             "one chosen on dev-a, or the last one scored)")
    paraphrases.add_argument("--checkpoint", type=Path, help="judge with the weights of one "
                             "of the run's checkpoint-*.pt instead: provisional, while no "
                             "epoch has finished (default: an epoch's weights)")
    paraphrases.add_argument("--no-teacher", action="store_true",
                             help="judge by the embedding alone (default: off)")
    paraphrases.add_argument("--backbone", type=Path, help="all-mpnet-base-v2's directory, "
                             "the embedding's and the teacher's (default: the packaged one)")
    paraphrases.set_defaults(handler=cmd_make_paraphrases, load_gemma=load_gemma)
