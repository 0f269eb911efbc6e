"""The teacher: a cross-encoder on the packaged all-mpnet-base-v2's 12-layer backbone, trained
once on the student's recipe (QQP train pairs plus the code-made negatives and variants of
``train.training_examples``; never QQP dev, never a held-out set) to label data offline.

It takes hours on one core, so it is a resumable run (``training_run``: checkpoints every
few minutes, ``--resume`` continues at the same step with the same batches), recorded in
``teacher.json`` with its seed, config, data and backbone hashes; the epoch with the best
dev-a AUC is the one that labels. Imports torch: training only.
"""

import logging
from dataclasses import asdict, dataclass
from pathlib import Path

from meancache.shared.errors import CheckpointError, VerifierError
from meancache.shared.files import sha256_file
from meancache.shared.pairs import read_pairs
from meancache.shared.progress import Progress
from meancache.shared.verifier.train import TrainConfig, training_examples
from meancache.shared.verifier.training_run import (
    EXAMPLES_FILE,
    LOG_FILE,
    Run,
    RunConfig,
    RunOptions,
    backbone_record,
    check_backbone,
    check_same_file,
    file_record,
    new_run_guard,
    pair_probabilities,
    read_examples,
    total_steps,
    train,
    write_examples,
)

log = logging.getLogger(__name__)

RECORD_FILE = Run(Path(), "teacher").record_file
__all__ = ["EXAMPLES_FILE", "LOG_FILE", "RECORD_FILE", "RunOptions", "TeacherConfig",
           "load_provisional", "load_teacher", "pair_probabilities", "read_record",
           "teacher_epoch", "train_teacher"]


@dataclass(frozen=True)
class TeacherConfig(RunConfig):
    """The teacher's: batch 16 at 2e-5 over 96 tokens (99.8% of QQP train pairs fit)."""


def read_record(out: Path) -> dict:
    return Run(out, "teacher").read_record()


def train_teacher(out: Path, data: Path, backbone: Path, config: TeacherConfig,
                  options: RunOptions, resume: bool = False,
                  progress: Progress | None = None) -> dict:
    """Start (or with ``resume`` continue) the run in ``out``, one process at a time;
    returns its record."""
    run = Run(out, "teacher")
    if resume:
        run.read_record()  # a clear error before anything is created
    with run.locked(), run.logging_to_file():
        if resume:
            record = run.read_record()
            config = TeacherConfig(**record["config"])
            check_same_file(record["data"]["qqp"], data, "QQP pairs file")
            check_backbone(record, backbone)
            examples = read_examples(run, record)
        else:
            record, examples = _start(run, data, backbone, config)
        model = train(run, record, examples, backbone, config, options, resume, progress)
        if model is None:
            return record
        record["finished"] = True
        record["chosen_epoch"] = max(record["epochs"],
                                     key=lambda e: e["dev"]["dev-a"]["auc"])["epoch"]
        run.write_record(record)
        log.info("finished; epoch %d chosen on dev-a AUC", record["chosen_epoch"])
        return record


def _start(run: Run, data: Path, backbone: Path, config: TeacherConfig
           ) -> tuple[dict, list[tuple[str, str, float]]]:
    """A new run's examples (written once, hashed) and its first record."""
    new_run_guard(run)
    train_pairs = read_pairs(data, split="train")
    dev = read_pairs(data, split="dev")
    recipe = TrainConfig(pairs=config.pairs, generated=config.generated, tau=config.tau,
                         seed=config.seed)
    examples, counts = training_examples(train_pairs, recipe)
    record = {
        "command": "meancache verifier train-teacher", "config": asdict(config),
        "seed": config.seed, "backbone": backbone_record(backbone),
        "data": {"qqp": {**file_record(data), "train_rows": len(train_pairs),
                         "dev_rows": len(dev),
                         "used": "train split for training; a seeded dev sample for the "
                                 "epoch reports (threshold on dev-a, dev-b reported only)"}},
        "examples": {**write_examples(run, examples), "kinds": counts},
        "steps": total_steps(len(examples), config), "checkpoint": None, "epochs": [],
        "finished": False,
    }
    run.write_record(record)
    return record, [(a, b, float(y)) for a, b, y in examples]


def teacher_epoch(out: Path, epoch: int | None = None) -> tuple[dict, dict]:
    """The run's record and the entry of the epoch ``load_teacher`` would load: no model,
    so a command can refuse a run that has none before it assembles the backbone."""
    record = read_record(out)
    if not record["epochs"]:
        raise VerifierError(f"the teacher run in {out} has not finished an epoch yet; "
                            "resume it first")
    wanted = epoch or record.get("chosen_epoch") or record["epochs"][-1]["epoch"]
    entry = next((e for e in record["epochs"] if e["epoch"] == wanted), None)
    if entry is None:
        done = ", ".join(str(e["epoch"]) for e in record["epochs"])
        raise VerifierError(f"the teacher run in {out} has no epoch {wanted} (done: {done})")
    return record, entry


def load_teacher(out: Path, backbone: Path, epoch: int | None = None
                 ) -> tuple[object, dict, dict]:
    """The run's model with an epoch's weights (default: the epoch chosen on dev-a, or the
    last one scored while the run goes on), its record and that epoch's entry; weights
    that are not the ones the record names are never loaded."""
    import torch
    from meancache.shared.verifier.model import from_backbone

    record, entry = teacher_epoch(out, epoch)
    check_backbone(record, backbone)
    path = out / entry["weights"]
    if not path.is_file() or sha256_file(path) != entry["weights_sha256"]:
        raise CheckpointError(f"the teacher's weights {path} are missing or not the ones "
                              f"{RECORD_FILE} names (sha256); they are not loaded")
    model = from_backbone(backbone)
    model.load_state_dict(torch.load(path, map_location="cpu", weights_only=True))
    return model.eval(), record, entry


def load_provisional(out: Path, backbone: Path, checkpoint: Path) -> tuple[object, dict, dict]:
    """The model weights of one of the run's training checkpoints, for provisional labels
    while no epoch has finished (``load_teacher`` takes only scored epochs). The run
    replaces its checkpoint every few minutes, so the file is read once, open, for both
    its sha256 (recorded with the labels) and its weights."""
    import hashlib

    import torch
    from meancache.shared.verifier.model import from_backbone

    record = read_record(out)
    check_backbone(record, backbone)
    try:
        with checkpoint.open("rb") as file:
            digest = hashlib.file_digest(file, "sha256").hexdigest()
            file.seek(0)
            state = torch.load(file, map_location="cpu", weights_only=True)
        model = from_backbone(backbone)
        model.load_state_dict(state["model"])
        step = int(state["position"]["step"])
    except (OSError, RuntimeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the teacher checkpoint {checkpoint} cannot be loaded ({exc}); "
                              f"pass one the run in {out} wrote (checkpoint-*.pt)") from None
    entry = {"checkpoint": checkpoint.name, "sha256": digest, "step": step,
             "steps": record["steps"], "provisional": True}
    return model.eval(), record, entry
