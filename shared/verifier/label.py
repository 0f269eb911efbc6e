"""The teacher's probability on each mined pair: the soft label the student is distilled
on, written beside the pair, with the teacher's weights named by sha256 so that the labels
can be committed and the student reproduced from them alone.

Labelling tens of thousands of pairs takes hours on a shared CPU, so it goes in chunks,
each appended to ``<out>.progress.jsonl`` (pair and label) as it is done: a rerun labels
only the pairs that file lacks (a larger pairs file included), under the same weights
only, and a kill loses at most the chunk under way."""

import json
import os
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import sha256_file, whole_lines, write_atomic
from meancache.shared.progress import Progress
from meancache.shared.verifier.mine import sources_key
from meancache.shared.verifier.rows import jsonl_text, read_rows
from meancache.shared.verifier.teacher import TeacherConfig, load_teacher, pair_probabilities
from meancache.shared.verifier.train import bfloat16_forward

IDENTITY = ("weights_sha256", "bfloat16", "device")  # what makes two runs' labels the same
BINS = 10  # the summary's histogram of labels: tenths of [0, 1]


def progress_paths(out: Path) -> tuple[Path, Path]:
    """The labels done so far (JSONL) and the weights they came from (JSON)."""
    return (out.with_name(f"{out.stem}.progress.jsonl"),
            out.with_name(f"{out.stem}.progress.json"))


def label_pairs(run: Path, backbone: Path, pairs: Path, out: Path, epoch: int | None = None,
                progress: Progress | None = None, limit: int | None = None,
                chunk: int = 512, device: str = "cpu") -> dict:
    """The first ``limit`` rows of ``pairs`` (default: all) with the field ``teacher``
    (P(same question)) into ``out`` (atomically), and a summary beside it (``.json``);
    returns the summary. Labels of earlier runs are reused from the progress file. The
    teacher runs on ``device`` (cpu or cuda)."""
    rows = read_rows(pairs, ("q1", "q2"))[:limit]
    model, record, entry = load_teacher(run, backbone, epoch)
    model.to(device)
    config = TeacherConfig(**record["config"])
    bf16 = config.bfloat16 and bfloat16_forward(device)
    teacher = {"run": str(run), "epoch": entry["epoch"],
               "weights_sha256": entry["weights_sha256"], "bfloat16": bf16, "device": device}
    done = _resume(out, teacher)
    reused = sum((r["q1"], r["q2"]) in done for r in rows)
    if progress is not None:
        progress(reused, len(rows))
    labelled = reused
    for start in range(0, len(rows), chunk):
        todo = list(dict.fromkeys((r["q1"], r["q2"]) for r in rows[start:start + chunk]
                                  if (r["q1"], r["q2"]) not in done))
        if not todo:
            continue
        probs = pair_probabilities(model, [a for a, _ in todo], [b for _, b in todo],
                                   config.max_tokens, backbone / "tokenizer.json", bf16)
        _append(out, [{"q1": a, "q2": b, "teacher": round(float(p), 6)}
                      for (a, b), p in zip(todo, probs, strict=True)])
        done.update(zip(todo, (round(float(p), 6) for p in probs), strict=True))
        labelled += len(todo)
        if progress is not None:
            progress(labelled, len(rows))
    for row in rows:
        row["teacher"] = done[(row["q1"], row["q2"])]
    write_atomic(out, jsonl_text(rows))
    labels = np.array([r["teacher"] for r in rows], dtype=np.float64)
    summary = {"pairs": len(rows), "reused": reused,
               "source": {"path": str(pairs), "sha256": sha256_file(pairs), "limit": limit},
               "teacher": {**teacher, "dev": entry["dev"]},
               "labels_sha256": sha256_file(out),
               "mean": round(float(labels.mean()), 4) if len(rows) else None,
               "share_over_half": round(float((labels >= 0.5).mean()), 4) if len(rows)
               else None,
               "histogram": np.histogram(labels, BINS, (0.0, 1.0))[0].tolist(),
               "by_sources": _by_sources(rows)}
    write_atomic(out.with_suffix(".json"), json.dumps(summary, indent=2) + "\n")
    return summary


def _by_sources(rows: list[dict]) -> dict[str, dict] | None:
    """Pairs and the share the teacher calls the same, per pair of mined sets (None for
    rows that do not name their sets)."""
    if not all(isinstance(r.get("sources"), list) for r in rows):
        return None
    groups: dict[str, list[float]] = {}
    for row in rows:
        groups.setdefault(sources_key(row), []).append(row["teacher"])
    return {key: {"pairs": len(v), "share_over_half": round(sum(p >= 0.5 for p in v) / len(v),
                                                             4)}
            for key, v in sorted(groups.items(), key=lambda kv: -len(kv[1]))}


def _resume(out: Path, teacher: dict) -> dict[tuple[str, str], float]:
    """The labels an earlier run appended, when it ran under the same weights; a last
    line a kill cut short is dropped from the file."""
    labels, named = progress_paths(out)
    if named.is_file():
        try:
            theirs = json.loads(named.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise VerifierError(f"cannot read {named} ({exc}); remove it and {labels.name} "
                                "to label again") from None
        if any(theirs.get(k) != teacher[k] for k in IDENTITY):
            raise VerifierError(f"the labels in {labels} came from other teacher weights "
                                f"({theirs}, not {teacher}); remove {labels.name} and "
                                f"{named.name}, or label into another --out")
    else:
        labels.unlink(missing_ok=True)  # no record of their weights: not reused
        write_atomic(named, json.dumps(teacher) + "\n")
    whole = whole_lines(labels)
    done: dict[tuple[str, str], float] = {}
    for number, line in enumerate(whole.split(b"\n")[:-1], 1):
        try:
            row = json.loads(line)
            done[(row["q1"], row["q2"])] = float(row["teacher"])
        except (ValueError, KeyError, TypeError):
            raise VerifierError(f"{labels}:{number}: not a labelled pair; remove the file "
                                "to label again") from None
    return done


def _append(out: Path, rows: list[dict]) -> None:
    """One chunk's labels, flushed to disk before the next chunk starts."""
    with progress_paths(out)[0].open("a", encoding="utf-8") as fh:
        fh.write(jsonl_text(rows))
        fh.flush()
        os.fsync(fh.fileno())
