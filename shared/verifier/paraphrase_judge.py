"""The filter on the language models' pairs: a pair is kept only where the embedding
(MPNet cosine at least the recall tau, where the cache starts to decide) and the teacher
(P(same) at least one half) both say it is the same request, and the rewording lost no
word that matters (``paraphrase.dropped_words``, applied again here so that pairs made
before that rule meet it too). What either doubts is
dropped, not relabelled: a small model's rewording that changed the meaning is not a
paraphrase the student should learn, and one the embedding puts far apart is not one the
cache would ever be asked about."""

import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import write_atomic
from meancache.shared.verifier.mine import RECALL_TAU
from meancache.shared.verifier.paraphrase import dropped_words, read_jsonl

THRESHOLD = 0.5  # the teacher's "same" (label-pairs' share_over_half)
EXAMPLES = 5

Scores = Callable[[list[str], list[str]], np.ndarray]


def agrees(cosine: float, teacher: float | None, tau: float = RECALL_TAU,
           threshold: float = THRESHOLD) -> bool:
    """Both judges say "same"; with no teacher (``None``), the embedding alone."""
    return cosine >= tau and (teacher is None or teacher >= threshold)


def judged_path(out: Path) -> Path:
    return out.with_suffix(".judged.jsonl")


def judge(out: Path, encode: Callable[[list[str]], np.ndarray], teacher: Scores | None,
          teacher_record: dict | None, tau: float = RECALL_TAU, seed: int = 0) -> dict:
    """Every pair of ``out`` with its cosine, teacher probability and verdict (``kept``)
    into ``<out>.judged.jsonl``; the kept share per model and kind and seeded examples of
    kept and dropped pairs per model into ``<out>.judged.json``; returns that summary."""
    rows = read_jsonl(out)
    if not rows:
        raise VerifierError(f"{out} holds no pairs to judge; make some first")
    sources, made = [r["source"] for r in rows], [r["paraphrase"] for r in rows]
    vectors = np.asarray(encode(sources + made), dtype=np.float32)
    cosines = np.sum(vectors[:len(rows)] * vectors[len(rows):], axis=1)
    probs = teacher(sources, made) if teacher is not None else [None] * len(rows)
    for row, cosine, prob in zip(rows, cosines, probs, strict=True):
        row["cosine"] = round(float(cosine), 6)
        row["teacher"] = None if prob is None else round(float(prob), 6)
        row["dropped"] = dropped_words(row["source"], row["paraphrase"])
        row["kept"] = agrees(float(cosine), None if prob is None else float(prob), tau) \
            and not row["dropped"]
    path = judged_path(out)
    write_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    summary = {"pairs": len(rows), "tau": tau, "teacher_threshold": THRESHOLD,
               "teacher": teacher_record, "embedding_only": teacher is None,
               "kept": _shares(rows, tau), "examples": _examples(rows, seed)}
    write_atomic(path.with_suffix(".json"), json.dumps(summary, indent=2, ensure_ascii=False)
                 + "\n")
    return summary


def _shares(rows: list[dict], tau: float) -> dict[str, dict]:
    """Per model and kind: pairs, kept, the share kept, and who dropped the rest (a pair
may be refused by more than one)."""
    found: dict[str, dict] = {}
    for row in rows:
        entry = found.setdefault(f"{row['model']}/{row['kind']}", {
            "pairs": 0, "kept": 0, "embedding_says_no": 0, "teacher_says_no": 0,
            "words_dropped": 0})
        entry["pairs"] += 1
        entry["kept"] += row["kept"]
        entry["embedding_says_no"] += row["cosine"] < tau
        entry["teacher_says_no"] += row["teacher"] is not None and row["teacher"] < THRESHOLD
        entry["words_dropped"] += bool(row["dropped"])
    for entry in found.values():
        entry["share"] = round(entry["kept"] / entry["pairs"], 4)
    return found


def _examples(rows: list[dict], seed: int) -> dict[str, dict[str, list[dict]]]:
    rng = np.random.default_rng(seed)
    found: dict[str, dict[str, list[dict]]] = {}
    for model in sorted({r["model"] for r in rows}):
        for verdict, name in ((True, "kept"), (False, "dropped")):
            pool = [r for r in rows if r["model"] == model and r["kept"] == verdict]
            picked = rng.choice(len(pool), min(EXAMPLES, len(pool)), replace=False) \
                if pool else []
            found.setdefault(model, {})[name] = [
                {k: pool[i][k] for k in ("kind", "source", "paraphrase", "cosine", "teacher",
                                         "dropped")}
                for i in sorted(picked)]
    return found
