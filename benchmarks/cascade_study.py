"""Could the teacher judge where the student is unsure? (issue 35, part 1: "if the teacher
itself is the best judge within the lookup budget, it may ship: measure both").

On benchmarks/decision_study.py's records (per asked question the counting candidates,
their cosines and the shipped student's probabilities, each pair alone), the teacher
scores the same candidates as a device would run it (exported to int8 ONNX as the
student is, each pair alone on one thread; ``--float``: the float32 model), and four
deciders are compared on the test splits and the held-out near-miss set:

- the shipped decision: the student's probabilities under the shipped card;
- the teacher alone: a decision card fitted on the teacher's probabilities exactly as
  decision_study.py fits the student's (the same choose splits, precision and cap);
- the cascade: the shipped card's score decides where it is far from doubt (served from
  ``hi`` up, declined under ``lo``), the teacher's card between them. The band is chosen
  on the choose splits: the highest mean choose hit rate with every choose split at the
  --precision and the rules' tuning set within the --near-misses cap, while at most
  --reach of the scored lookups fall in the band (each of those pays the teacher's time);
- embedding only, for scale.

The teacher's probabilities are computed once and kept under --work, named by the
records and the teacher's weights. A lookup that reaches the teacher costs its pairs'
time more (benchmarks/teacher_latency.py); with fewer than half the lookups reaching it
the p50 is a fast lookup's, its p99 is not.

    python benchmarks/cascade_study.py --work /work/decide --groups 1000 --run TEACHER_RUN
    python benchmarks/cascade_study.py ... --checkpoint RUN/checkpoint-0003896.pt
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch
from _common import make_table, note, pct, print_command, print_table
from decision_study import (
    DOMAINS,
    FITS,
    HELD_OUT,
    TUNING,
    Fitting,
    Study,
    choice_options,
    collect,
    fitted,
    quality,
    records_parser,
    scores_of_x,
    variant_of,
)
from meancache.shared.encoder import profile_threshold
from meancache.shared.encoder.packaged import MPNET, ensure_assembled
from meancache.shared.onnx_session import cpu_session
from meancache.shared.progress import Progress
from meancache.shared.verifier.decision import LearnedDecision
from meancache.shared.verifier.federated import export_int8
from meancache.shared.verifier.runtime import MODEL_FILE, LearnedVerifier
from meancache.shared.verifier.teacher import TeacherConfig, load_provisional, load_teacher
from meancache.shared.verifier.tokens import tokenize_pairs
from meancache.shared.verifier.training_run import pair_probabilities

GRID = np.round(np.arange(0.0, 1.0001, 0.01), 3)  # the band's ends, on the card's score
SHIPPED, TEACHER, CASCADE = "student + card", "teacher + card", "cascade"


def parse_args() -> argparse.Namespace:
    parser = records_parser(__doc__, groups=1000)
    parser.add_argument("--run", type=Path, required=True, help="the teacher's run directory")
    parser.add_argument("--epoch", type=int, help="its epoch (default: the chosen one)")
    parser.add_argument("--checkpoint", type=Path,
                        help="a training checkpoint's weights instead (while no epoch is done)")
    choice_options(parser)
    parser.add_argument("--reach", type=float, nargs="+", default=[0.2, 0.35, 0.5],
                        help="the most of the scored lookups the teacher may judge (one "
                        "cascade per value)")
    parser.add_argument("--float", action="store_true",
                        help="score with the float32 teacher (PyTorch, batched) instead of "
                        "its int8 ONNX export, each pair alone, as a device would run it")
    parser.add_argument("--threads", type=int, default=2,
                        help="torch threads for the float32 teacher")
    parser.set_defaults(cap_choose_splits=False)
    return parser.parse_args()


def teacher_records(records: list[dict], records_path: Path, args: argparse.Namespace
                    ) -> tuple[list[dict], dict]:
    """The records with the teacher's probabilities in place of the student's (same
    candidates; kept in --work), and what the teacher is."""
    backbone = ensure_assembled(MPNET, args.cache_dir / "models")
    model, record, entry = (load_provisional(args.run, backbone, args.checkpoint)
                            if args.checkpoint else load_teacher(args.run, backbone, args.epoch))
    weights = entry.get("weights_sha256") or entry["sha256"]
    threshold = entry.get("dev", {}).get("dev-a", {}).get("threshold", 0.5)
    kind = "float32" if args.float else "int8"
    about = {"weights": weights, "threshold": float(threshold), "as": kind,
             "epoch": entry.get("epoch"), "step": entry.get("step")}
    path = args.work / f"teacher-{records_path.stem}-{weights[:12]}-{kind}.json"
    if path.is_file():
        note(f"teacher probabilities from {path}")
        probabilities = json.loads(path.read_text())
    else:
        first = [r["query"] for r in records for _ in r["probabilities"]]
        second = [r["texts"][i] for r in records for i in range(len(r["probabilities"]))]
        note(f"the teacher ({kind}) scores {len(first)} pairs of {len(records)} lookups")
        max_tokens = TeacherConfig(**record["config"]).max_tokens
        tokenizer = backbone / "tokenizer.json"
        progress = _every_tenth("teacher pairs")
        if args.float:
            torch.set_num_threads(args.threads)
            flat = pair_probabilities(model, first, second, max_tokens, tokenizer, False,
                                      batch=16, progress=progress)
        else:
            int8 = args.work / f"teacher-int8-{weights[:12]}"
            if not (int8 / MODEL_FILE).is_file():
                note(f"exporting the teacher to int8 ONNX in {int8}")
                with torch.no_grad():
                    export_int8(model, int8, float(threshold))
            flat = Int8Teacher(int8 / MODEL_FILE, max_tokens, tokenizer).probabilities(
                first, second, progress)
        probabilities, at = [], 0
        for r in records:
            n = len(r["probabilities"])
            probabilities.append([float(p) for p in flat[at:at + n]])
            at += n
        path.write_text(json.dumps(probabilities))
    return [{**r, "probabilities": p} for r, p in zip(records, probabilities, strict=True)], about


class Int8Teacher:
    """The teacher's int8 ONNX export on one thread, each pair scored alone, as the client
    scores a candidate (runtime.LearnedVerifier: int8 activations are quantised per call)."""

    def __init__(self, model: Path, max_tokens: int, tokenizer: Path) -> None:
        self._session = cpu_session(model, threads=1)
        self._max_tokens, self._tokenizer = max_tokens, tokenizer

    def probability(self, first: str, second: str) -> float:
        tokens = tokenize_pairs([first], [second], self._max_tokens, self._tokenizer)
        (logit,) = self._session.run(None, tokens.feeds())
        return float(1.0 / (1.0 + np.exp(-float(np.asarray(logit).reshape(-1)[0]))))

    def probabilities(self, first: list[str], second: list[str], progress: Progress
                      ) -> np.ndarray:
        out = np.empty(len(first))
        for i, pair in enumerate(zip(first, second, strict=True)):
            out[i] = self.probability(*pair)
            if (i + 1) % 64 == 0 or i + 1 == len(first):
                progress(i + 1, len(first))
        return out


def _every_tenth(what: str) -> Progress:
    shown = [0]

    def report(done: int, total: int) -> None:
        if total and done * 10 // total > shown[0]:
            shown[0] = done * 10 // total
            note(f"{what}: {done}/{total}")
    return report


class Cascade:
    """Per lookup: served and right under the student's card, the teacher's, or a band."""

    def __init__(self, student: Study, s_scores: np.ndarray, s_system: str, s_t: float,
                 teacher: Study, t_fit: Fitting) -> None:
        self.student, self.teacher = student, teacher
        self.s_scores = np.where(student.scored & ~student.same, s_scores, -1.0)
        self.shipped = student.served(s_system, s_scores, s_t)[:2]
        self.s_gate = student.served(s_system, s_scores, 0.0)[:2]  # the card's parts only
        t_system = t_fit.shipped
        self.t_system, self.t_threshold = t_system, t_fit.thresholds[t_system]
        self.alone = teacher.served(t_system, t_fit.scores, self.t_threshold)[:2]

    def band(self, lo: float, hi: float) -> np.ndarray:
        return (self.s_scores >= lo) & (self.s_scores < hi)

    def served(self, lo: float, hi: float) -> tuple[np.ndarray, np.ndarray]:
        """The teacher's verdict in [lo, hi), the card's parts from hi up, none under lo
        (the very same question is served by identity throughout)."""
        band, upper = self.band(lo, hi), self.s_scores >= hi
        served = self.student.same | (band & self.alone[0]) | (upper & self.s_gate[0])
        right = (self.student.same & self.s_gate[1]) | (band & self.alone[1]) \
            | (upper & self.s_gate[1])
        return served, right

    def reach(self, lo: float, hi: float, mask: np.ndarray) -> float:
        counted = mask & self.student.scored & ~self.student.same
        return float(self.band(lo, hi)[counted].mean()) if counted.any() else 0.0


def choose_band(c: Cascade, args: argparse.Namespace, reach: float
                ) -> tuple[float, float, float] | None:
    """(lo, hi, mean choose hit rate) of the best band within ``reach`` (choose splits)."""
    study = c.student
    choose = np.isin(study.domain, DOMAINS) & (study.split == "choose")
    tuning = study.where(TUNING, "test")
    best = None
    for lo in GRID:
        for hi in GRID[GRID > lo]:
            if c.reach(lo, hi, choose) > reach:
                break  # the band only widens with hi
            served, right = c.served(lo, hi)
            qs = [quality(study, study.where(d, "choose"), served, right) for d in DOMAINS]
            if any(q["precision"] < args.precision for q in qs) or \
                    quality(study, tuning, served, right)["unanswerable served"] > args.near_misses:
                continue
            rate = float(np.mean([q["hit rate"] for q in qs]))
            if best is None or rate > best[2] + 1e-9:
                best = (float(lo), float(hi), rate)
    return best


def main() -> None:
    args = parse_args()
    print_command()
    records, path = collect(args)
    decision = LearnedDecision.load()
    tau = profile_threshold("mpnet")
    student_threshold = LearnedVerifier.load(args.verifier).threshold
    student = Study(records, tau, tau - args.recall_margin, student_threshold)
    s_scores = scores_of_x(student.x, decision.coefficients, decision.intercept)
    t_records, about = teacher_records(records, path, args)
    note(f"teacher: {about}")
    teacher = Study(t_records, tau, tau - args.recall_margin, about["threshold"])
    fits = [fitted(teacher, name, args) for name in FITS]
    t_fit = max(fits, key=lambda f: f.rates[f.shipped])
    note(f"the teacher's card: the {t_fit.name} fit, {t_fit.shipped} at "
         f"{t_fit.thresholds[t_fit.shipped]}")
    c = Cascade(student, s_scores, variant_of(decision.keeps), decision.threshold, teacher, t_fit)
    deciders = {"embedding only": student.served("embedding only")[:2],
                f"{SHIPPED} @ {decision.threshold}": c.shipped,
                f"{TEACHER} @ {c.t_threshold}": c.alone}
    bands = {}
    for reach in args.reach:
        chosen = choose_band(c, args, reach)
        if chosen is None:
            note(f"reach {pct(reach)}: no band keeps the choose splits' precision and cap")
            continue
        lo, hi, rate = chosen
        note(f"reach <= {pct(reach)}: band [{lo}, {hi}), mean choose hit rate {pct(rate)}")
        name = f"{CASCADE} [{lo}, {hi})"
        deciders[name] = c.served(lo, hi)
        bands[name] = (lo, hi)
    note("per domain: hit precision @ hit rate; held-out: near-misses served / paraphrases "
         "hit; teacher: the share of scored lookups it judges")
    table = make_table(["decider", "split", *DOMAINS, "held-out", "teacher"], right_from=2)
    for name, (served, right) in deciders.items():
        for split in ("choose", "test"):
            cells = [quality(student, student.where(d, split), served, right) for d in DOMAINS]
            held = quality(student, student.where(HELD_OUT, "test"), served, right)
            mask = np.isin(student.domain, DOMAINS) & (student.split == split)
            reach = (c.reach(*bands[name], mask) if name in bands else
                     1.0 if name.startswith(TEACHER) else 0.0)
            table.add_row(name if split == "choose" else "", split,
                          *(f"{pct(q['precision'])} @ {pct(q['hit rate'])}" for q in cells),
                          "" if split == "choose" else
                          f"{pct(held['unanswerable served'])} / {pct(held['hit rate'])}",
                          pct(reach))
    print_table(table)


if __name__ == "__main__":
    main()
