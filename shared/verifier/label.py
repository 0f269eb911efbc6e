"""The teacher's probability on each mined pair: the soft label the student is distilled
on, written beside the pair, with the teacher's weights named by sha256 so that the labels
can be committed and the student reproduced from them alone."""

import json
from pathlib import Path

from meancache.shared.files import sha256_file, write_atomic
from meancache.shared.progress import Progress
from meancache.shared.verifier.rows import read_rows
from meancache.shared.verifier.teacher import TeacherConfig, load_teacher, pair_probabilities
from meancache.shared.verifier.train import bfloat16_matmuls


def label_pairs(run: Path, backbone: Path, pairs: Path, out: Path, epoch: int | None = None,
                progress: Progress | None = None) -> dict:
    """Every row of ``pairs`` with the field ``teacher`` (P(same question)) into ``out``
    (atomically), and a summary beside it (``.json``); returns the summary."""
    rows = read_rows(pairs, ("q1", "q2"))
    model, record, entry = load_teacher(run, backbone, epoch)
    config = TeacherConfig(**record["config"])
    bf16 = config.bfloat16 and bfloat16_matmuls()
    probs = pair_probabilities(model, [r["q1"] for r in rows], [r["q2"] for r in rows],
                               config.max_tokens, backbone / "tokenizer.json", bf16,
                               progress=progress)
    for row, prob in zip(rows, probs, strict=True):
        row["teacher"] = round(float(prob), 6)
    write_atomic(out, "".join(json.dumps(r) + "\n" for r in rows))
    summary = {"pairs": len(rows), "source": {"path": str(pairs), "sha256": sha256_file(pairs)},
               "teacher": {"run": str(run), "epoch": entry["epoch"],
                           "weights_sha256": entry["weights_sha256"], "bfloat16": bf16,
                           "dev": entry["dev"]},
               "labels_sha256": sha256_file(out),
               "mean": round(float(probs.mean()), 4),
               "share_over_half": round(float((probs >= 0.5).mean()), 4)}
    write_atomic(out.with_suffix(".json"), json.dumps(summary, indent=2) + "\n")
    return summary
