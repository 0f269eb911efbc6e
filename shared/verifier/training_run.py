"""A resumable training run of a cross-encoder: the teacher's (``teacher``) and the student
distilled from it (``distil``) alike. Either takes from an hour to many hours on a shared
CPU, so a run can stop anywhere and continue where it stopped.

Every few minutes the model, the optimiser, the schedule, the torch RNG (dropout) and the
position in the seeded data order are written atomically to ``checkpoint-<step>.pt`` and
only then named, with their sha256, in the run's record (a JSON file beside it); a resume
loads exactly that file and continues at the same step with the same batches, so a run
stopped and resumed ends with the weights of one that never stopped. The examples are
written once (``examples.jsonl``, hashed), so a resume never rebuilds them. Each epoch ends
with the model's AUC and F0.5 on a seeded QQP dev sample (threshold chosen on dev-a, dev-b
only reported) and its weights (``epoch-<n>.pt``). Imports torch: training only.
"""

import json
import logging
import math
import random
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
from meancache.shared.errors import CheckpointError, VerifierError
from meancache.shared.files import atomic_path, sha256_file, write_atomic
from meancache.shared.pairs import read_pairs
from meancache.shared.progress import Progress
from meancache.shared.threshold import DEFAULT_THRESHOLD
from meancache.shared.verifier.rows import read_rows
from meancache.shared.verifier.tokens import tokenize_pairs
from meancache.shared.verifier.train import (
    batches,
    bfloat16_forward,
    dev_report,
    model_device,
    train_step,
)

log = logging.getLogger(__name__)
_PACKAGE = __name__.rpartition(".")[0]  # meancache.shared.verifier: every training module

EXAMPLES_FILE = "examples.jsonl"
LOG_FILE = "train.log"

Example = tuple[str, str, float]  # (question, question, target in [0, 1])


@dataclass(frozen=True)
class RunConfig:
    """What decides the weights; fixed for a run (a resume reads it from the record).
    The teacher and the student each set their own defaults."""

    pairs: int = 60_000  # QQP train pairs drawn (more than the split holds: all of them)
    generated: int = 10_000  # code-made hard negatives (and a quarter as many variants)
    epochs: int = 2
    batch: int = 16
    learning_rate: float = 2e-5
    warmup: float = 0.06  # share of the steps
    weight_decay: float = 0.01
    max_tokens: int = 96  # both questions together
    tau: float = DEFAULT_THRESHOLD  # MiniLM cosine over which a label-0 pair is "hard"
    dev_pairs: int = 4_000  # seeded QQP dev sample scored after each epoch
    seed: int = 0
    bfloat16: bool = True  # autocast the forward pass where the CPU multiplies bf16 natively


@dataclass(frozen=True)
class RunOptions:
    """How this invocation runs; free to change between a run and its resume."""

    threads: int = 1  # torch threads: one leaves the other core to everyone else
    device: str = "cpu"  # or "cuda": where the model trains (a checkpoint resumes on either)
    checkpoint_minutes: float = 5.0
    stop_after: int | None = None  # steps in this invocation, then checkpoint and return
    log_every: int = 20  # steps between progress lines in the log


@dataclass
class Position:
    """Where the run is: ``position`` batches of epoch ``epoch`` (0-based) are done."""

    step: int = 0
    epoch: int = 0
    position: int = 0
    seconds: float = 0.0  # training time spent over all invocations
    loss: float = 0.0  # running (exponential) mean


@dataclass(frozen=True)
class Run:
    """A run's directory and its record there (``teacher.json``, ``student.json``): the
    one file that says what the run is and how far it got."""

    out: Path
    what: str  # "teacher", "student": what the run trains, in messages and file names

    @property
    def record_file(self) -> str:
        return f"{self.what}.json"

    @property
    def record_path(self) -> Path:
        return self.out / self.record_file

    def read_record(self) -> dict:
        try:
            return json.loads(self.record_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise VerifierError(f"{self.out} holds no {self.what} run to resume "
                                f"({self.record_file} is missing); start one without "
                                "--resume") from None
        except (OSError, ValueError) as exc:
            raise VerifierError(f"the run's record {self.record_path} cannot be read "
                                f"({exc})") from None

    def write_record(self, record: dict) -> None:
        write_atomic(self.record_path, json.dumps(record, indent=2) + "\n", durable=True)

    @contextmanager
    def locked(self) -> Iterator[None]:
        """One process at a time trains in a run's directory."""
        from filelock import FileLock, Timeout

        self.out.mkdir(parents=True, exist_ok=True)
        try:
            with FileLock(self.out / f".{self.what}.lock", timeout=0):
                yield
        except Timeout:
            raise VerifierError(f"another process is training the {self.what} in "
                                f"{self.out}; wait for it to end, or stop it first") from None

    @contextmanager
    def logging_to_file(self) -> Iterator[None]:
        """The run's progress lines into its ``train.log`` (never the terminal): those of
        every verifier training module, the drawing of the examples (``train``) too."""
        handler = logging.FileHandler(self.out / LOG_FILE, encoding="utf-8")
        handler.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        training = logging.getLogger(_PACKAGE)
        training.addHandler(handler)
        training.setLevel(logging.INFO)
        try:
            yield
        finally:
            training.removeHandler(handler)
            handler.close()


def new_run_guard(run: Run) -> None:
    """A new run never starts over an existing one."""
    if run.record_path.exists():
        raise VerifierError(f"{run.out} already holds a {run.what} run ({run.record_file}); "
                            "continue it with --resume, or pass another --out")


def write_examples(run: Run, examples: list[Example]) -> dict:
    """The examples, once, hashed: a resume reads exactly these."""
    text = "".join(json.dumps({"q1": a, "q2": b, "label": y}, ensure_ascii=False) + "\n"
                   for a, b, y in examples)
    write_atomic(run.out / EXAMPLES_FILE, text, durable=True)
    return {"file": EXAMPLES_FILE, "sha256": sha256_file(run.out / EXAMPLES_FILE),
            "count": len(examples)}


def read_examples(run: Run, record: dict) -> list[Example]:
    path = run.out / record["examples"]["file"]
    if not path.is_file() or sha256_file(path) != record["examples"]["sha256"]:
        raise VerifierError(f"{path} is missing or not the examples this run started with "
                            "(its sha256 differs from the record's); start a new run")
    return [(r["q1"], r["q2"], float(r["label"])) for r in read_rows(path, ("q1", "q2"))]


def file_record(path: Path) -> dict:
    return {"path": str(path.resolve()), "sha256": sha256_file(path)}


def check_same_file(entry: dict, path: Path, what: str) -> None:
    """A resume reads the very files the run started from."""
    if not path.is_file() or sha256_file(path) != entry["sha256"]:
        raise VerifierError(f"{path} is not the file this run was trained on as its {what} "
                            f"(its sha256 differs from the record's, {entry['path']}); "
                            "pass that file")


def backbone_record(backbone: Path) -> dict:
    config = backbone / "config.json"
    if not config.is_file():
        raise VerifierError(f"{backbone} holds no config.json: pass a transformer model "
                            "directory as the backbone")
    return {"path": str(backbone.resolve()), "name": backbone.name,
            "config_sha256": sha256_file(config),
            "tokenizer_sha256": sha256_file(backbone / "tokenizer.json")}


def check_backbone(record: dict, backbone: Path) -> None:
    """The run's weights fit only the backbone (architecture, tokenizer) it started from."""
    now = backbone_record(backbone)
    for key in ("config_sha256", "tokenizer_sha256"):
        if now[key] != record["backbone"][key]:
            raise VerifierError(f"the backbone {backbone} is not the one this run started "
                                f"from ({record['backbone']['path']}); pass that one")


def total_steps(examples: int, config: RunConfig) -> int:
    return config.epochs * math.ceil(examples / config.batch)


def train(run: Run, record: dict, examples: list[Example], backbone: Path,
          config: RunConfig, options: RunOptions, resume: bool,
          progress: Progress | None) -> object | None:
    """Train from the start, or from the recorded checkpoint, until every epoch is done
    (returns the model, in eval mode) or ``options.stop_after`` steps (returns None)."""
    import torch
    from meancache.shared.verifier.model import from_backbone

    torch.set_num_threads(options.threads)
    torch.manual_seed(config.seed)  # the fresh head
    model = from_backbone(backbone).to(options.device).train()
    # The word embeddings stay as the backbone learned them: a fifth to a third of the
    # weights, whose optimiser state would cost more than one pass teaches them.
    model.backbone.get_input_embeddings().weight.requires_grad_(False)
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=config.learning_rate, weight_decay=config.weight_decay)
    steps = record["steps"]
    warm = max(1, int(steps * config.warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / max(1, steps - warm))))
    at = Position()
    if resume and record["checkpoint"] is not None:
        at = load_checkpoint(run, record, model, optimiser, schedule)
        log.info("resumed at step %d (epoch %d, batch %d)", at.step, at.epoch + 1,
                 at.position)
    _remove_partials(run.out)
    bf16 = config.bfloat16 and bfloat16_forward(options.device)
    record.setdefault("invocations", []).append({
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "from_step": at.step,
        **asdict(options), "bfloat16": bf16, "torch": torch.__version__})
    run.write_record(record)
    tokenizer = backbone / "tokenizer.json"
    per_epoch = math.ceil(len(examples) / config.batch)
    log.info("%s: %d examples, %d steps (%d per epoch), batch %d, forward in %s on %s, "
             "%d thread(s)", run.what, len(examples), steps, per_epoch,
             config.batch, "bfloat16" if bf16 else "float32", options.device,
             options.threads)
    run_steps, started, last_save = 0, time.monotonic(), time.monotonic()
    window = (time.monotonic(), at.step)
    while True:
        _evaluate_pending(run, record, model, at, config, tokenizer, bf16)
        if at.epoch >= config.epochs:
            return model.eval()
        order = batches(examples, config.batch, random.Random(config.seed * 1_000_003
                                                               + at.epoch))
        for rows in order[at.position:]:
            tick = time.monotonic()
            value = train_step(model, rows, config.max_tokens, tokenizer, bf16, optimiser,
                               schedule)
            at.step, at.position, run_steps = at.step + 1, at.position + 1, run_steps + 1
            at.seconds += time.monotonic() - tick
            at.loss = value if at.step == 1 else 0.98 * at.loss + 0.02 * value
            if progress is not None:
                progress(at.step, steps)
            if at.step % options.log_every == 0:
                window = _log_progress(at, steps, config, window, started, run_steps,
                                       schedule.get_last_lr()[0])
            stop = options.stop_after is not None and run_steps >= options.stop_after
            if stop or time.monotonic() - last_save >= options.checkpoint_minutes * 60:
                save_checkpoint(run, record, model, optimiser, schedule, at)
                last_save = time.monotonic()
            if stop:
                log.info("stopped after %d steps of this run (step %d of %d); continue "
                         "with --resume", run_steps, at.step, steps)
                return None
        at.epoch, at.position = at.epoch + 1, 0
        save_checkpoint(run, record, model, optimiser, schedule, at)
        last_save = time.monotonic()


def _log_progress(at: Position, steps: int, config: RunConfig,
                  window: tuple[float, int], started: float, run_steps: int,
                  lr: float) -> tuple[float, int]:
    """One log line: step, examples/s (since the last line), loss, learning rate, ETA
    (from this invocation's mean speed)."""
    now = time.monotonic()
    rate = (at.step - window[1]) * config.batch / max(now - window[0], 1e-9)
    left = (steps - at.step) * (now - started) / run_steps
    log.info("step %d/%d  epoch %d/%d  %.1f examples/s  loss %.4f  lr %.2e  ETA %s",
             at.step, steps, at.epoch + 1, config.epochs, rate, at.loss, lr,
             _duration(left))
    return now, at.step


def _duration(seconds: float) -> str:
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60):02d}m"


def save_checkpoint(run: Run, record: dict, model: object, optimiser: object,
                    schedule: object, at: Position) -> None:
    """Write ``checkpoint-<step>.pt`` beside the record (renamed in only once complete and
    on disk), then name it and its sha256 in the record, then drop the older one: a kill
    at any point leaves a record that names a whole checkpoint."""
    import torch

    name = f"checkpoint-{at.step:07d}.pt"
    started = time.monotonic()
    state = {"model": model.state_dict(), "optimiser": optimiser.state_dict(),
             "schedule": schedule.state_dict(), "torch_rng": torch.get_rng_state(),
             "position": asdict(at)}
    if model_device(model).type == "cuda":  # dropout draws from the GPU's generator there
        state["cuda_rng"] = torch.cuda.get_rng_state()
    with atomic_path(run.out / name, durable=True) as partial:
        torch.save(state, partial)
    previous = record["checkpoint"]
    record["checkpoint"] = {"file": name, "sha256": sha256_file(run.out / name), **asdict(at),
                            "written": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    run.write_record(record)
    if previous is not None and previous["file"] != name:
        (run.out / previous["file"]).unlink(missing_ok=True)
    log.info("checkpoint %s written in %.1f s", name, time.monotonic() - started)


def load_checkpoint(run: Run, record: dict, model: object, optimiser: object,
                    schedule: object) -> Position:
    """The recorded checkpoint into the model, optimiser and schedule, and the RNG; a file
    that is missing or not the one recorded (damaged, replaced) is never loaded."""
    import torch

    entry = record["checkpoint"]
    path = run.out / entry["file"]
    if not path.is_file():
        raise CheckpointError(f"the checkpoint {path} named in {run.record_file} is missing; "
                              "the run cannot resume (start a new one in another --out)")
    if sha256_file(path) != entry["sha256"]:
        raise CheckpointError(f"the checkpoint {path} is damaged (its sha256 is not the one "
                              f"{run.record_file} recorded); it is not loaded. Start a new "
                              "run in another --out")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimiser.load_state_dict(state["optimiser"])
        schedule.load_state_dict(state["schedule"])
        torch.set_rng_state(state["torch_rng"])
        if "cuda_rng" in state and model_device(model).type == "cuda":
            torch.cuda.set_rng_state(state["cuda_rng"])
        return Position(**state["position"])
    except (RuntimeError, KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(f"the checkpoint {path} cannot be loaded into this model "
                              f"({exc}); it is not used") from None


def _remove_partials(out: Path) -> None:
    """Files a killed run was writing (never named in the record)."""
    for partial in out.glob(".*.partial"):
        partial.unlink(missing_ok=True)


def _evaluate_pending(run: Run, record: dict, model: object, at: Position,
                      config: RunConfig, tokenizer: Path, bf16: bool) -> None:
    """After a finished epoch not yet scored: its dev report and weights into the record."""
    import torch

    if at.position != 0 or at.epoch == 0 or any(e["epoch"] == at.epoch
                                                 for e in record["epochs"]):
        return
    data = Path(record["data"]["qqp"]["path"])
    dev = read_pairs(data, split="dev")
    dev = random.Random(config.seed).sample(dev, min(config.dev_pairs, len(dev)))
    started = time.monotonic()
    probs = pair_probabilities(model, [p.q1 for p in dev], [p.q2 for p in dev],
                               config.max_tokens, tokenizer, bf16)
    threshold, report = dev_report(probs, dev)
    weights = f"epoch-{at.epoch}.pt"
    with atomic_path(run.out / weights, durable=True) as partial:
        torch.save(model.state_dict(), partial)
    record["epochs"].append({"epoch": at.epoch, "step": at.step, "dev": report,
                             "threshold_on_dev_a": round(threshold, 6),
                             "dev_sample": len(dev), "weights": weights,
                             "weights_sha256": sha256_file(run.out / weights),
                             "minutes_training": round(at.seconds / 60, 1)})
    run.write_record(record)
    log.info("epoch %d: dev-a AUC %.4f F0.5 %.4f, dev-b AUC %.4f F0.5 %.4f (%.0f s)",
             at.epoch, report["dev-a"]["auc"], report["dev-a"]["f05"],
             report["dev-b"]["auc"], report["dev-b"]["f05"], time.monotonic() - started)


def pair_probabilities(model: object, first: list[str], second: list[str],
                       max_tokens: int, tokenizer: Path, bf16: bool,
                       batch: int = 64, progress: Progress | None = None) -> np.ndarray:
    """P(same question) of each pair, in batches of similar length (little padding), on
    the model's device."""
    import torch

    order = sorted(range(len(first)), key=lambda i: len(first[i]) + len(second[i]))
    out = np.empty(len(first), dtype=np.float64)
    device = model_device(model)
    model.eval()
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for start in range(0, len(order), batch):
            rows = order[start:start + batch]
            tokens = tokenize_pairs([first[i] for i in rows], [second[i] for i in rows],
                                    max_tokens, tokenizer)
            logits = model(*(torch.from_numpy(x).to(device) for x in (
                tokens.input_ids, tokens.attention_mask, tokens.token_type_ids)))
            out[rows] = torch.sigmoid(logits.float()).cpu().numpy()
            if progress is not None:
                progress(start + len(rows), len(order))
    model.train()
    return out
