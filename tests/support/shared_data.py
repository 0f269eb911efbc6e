"""A tiny ``../shared/data`` in a test's directory: the layout ``mine.question_sets`` reads
(QQP pairs with splits, Arena and ShareGPT first turns, the contextual sets), with the
texts a test chooses."""

import json
from collections.abc import Sequence
from pathlib import Path


def write_data_root(root: Path, qqp: Sequence[tuple[str, str, int, str]],
                    arena: Sequence[str], sharegpt: Sequence[str],
                    contextual: Sequence[tuple[str, str]] = (), unique: Sequence[str] = ()
                    ) -> Path:
    """``qqp``: (q1, q2, label, split) rows (``read_pairs`` needs a train and a dev one);
    ``arena``, ``sharegpt``: first turns (at least one each); ``contextual``: (main,
    follow-up) queries, in both contextual files; ``unique``: the unique_u0 and unique_u1
    questions."""
    (root / "qqp").mkdir(parents=True)
    (root / "qqp" / "pairs.jsonl").write_text("".join(
        json.dumps({"q1": a, "q2": b, "label": y, "split": s}) + "\n" for a, b, y, s in qqp))
    (root / "instructions").mkdir()
    for name, texts in (("arena", arena), ("sharegpt", sharegpt)):
        (root / "instructions" / f"{name}_first_turns.jsonl").write_text(
            "".join(json.dumps({"id": f"{name}_{i}", "text": t}) + "\n"
                    for i, t in enumerate(texts)))
    (root / "contextual").mkdir()
    rows = [{"Main Query": a, "Main Query Response": "-", "Follow-Up Query": b,
             "Follow Up Query Response": "-"} for a, b in contextual]
    for name in ("contextual_queries", "d1"):
        (root / "contextual" / f"{name}.json").write_text(json.dumps(rows))
    for name in ("unique_u0", "unique_u1"):
        (root / "contextual" / f"{name}.json").write_text(json.dumps(list(unique)))
    return root
