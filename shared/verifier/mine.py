"""Mined pairs for the teacher to label (the Augmented SBERT recipe): questions of every set
in ``../shared/data`` paired with their nearest neighbours under the embedding, in the band
where the cache decides (cosine from the recall tau up), so the student later learns the
teacher's judgement exactly where the embedding alone cannot tell.

The embedding, hours for every question on a shared CPU, is checkpointed in shards beside
the output and resumed on a rerun (``embedding_shards``); ``per_source`` caps each source's
questions at a seeded sample, the same questions first for any cap, so a smaller run's
vectors serve a larger one and QQP's hundred thousand do not drown the other sets.

Never mined: QQP dev's questions (the reports are made on them) and any question of the
pair files handed in as ``exclude`` (the repo's near-miss sets). Each pair gets a split ("train",
"choose", "test") from a seeded hash of the pair itself, before anything is trained on it.
"""

import hashlib
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import write_atomic
from meancache.shared.pairs import read_pairs
from meancache.shared.progress import Progress
from meancache.shared.verifier.embedding_shards import embed_resumably
from meancache.shared.verifier.rows import read_rows

# all-mpnet-base-v2's tau (0.876) less the learned verifier's recall margin (0.1): where
# the cache starts asking the verifier.
RECALL_TAU = 0.776
SPLITS = (("train", 0.8), ("choose", 0.1), ("test", 0.1))


@dataclass(frozen=True)
class Question:
    text: str
    source: str  # which set it came from ("qqp-train", "arena", ...)


def question_sets(data_root: Path, max_chars: int, exclude: tuple[Path, ...] = ()
                  ) -> list[Question]:
    """Every question of the shared sets, each distinct text once (its first source), none
    longer than ``max_chars`` (a long prompt is not what a pair judge reads), none of QQP
    dev's or of the ``exclude`` pair files."""
    qqp = data_root / "qqp" / "pairs.jsonl"
    held = [p for path in exclude for p in read_pairs(path)] + read_pairs(qqp, split="dev")
    dev = {_key(t) for p in held for t in (p.q1, p.q2)}
    found: list[Question] = []
    found += [Question(t, "qqp-train") for p in read_pairs(qqp, split="train")
              for t in (p.q1, p.q2)]
    for name in ("arena", "sharegpt"):
        path = data_root / "instructions" / f"{name}_first_turns.jsonl"
        found += [Question(r["text"], name) for r in read_rows(path, ("text",))]
    contextual = data_root / "contextual"
    for name in ("contextual_queries", "d1"):
        for row in _json(contextual / f"{name}.json"):
            found += [Question(row[k], "contextual") for k in ("Main Query", "Follow-Up Query")]
    for name in ("unique_u0", "unique_u1"):
        found += [Question(t, "contextual") for t in _json(contextual / f"{name}.json")]
    seen = set(dev)
    kept = []
    for question in found:
        key = _key(question.text)
        if key and key not in seen and len(question.text) <= max_chars:
            seen.add(key)
            kept.append(question)
    return kept


def _key(text: str) -> str:
    """Texts that differ only in case and spacing are the same question."""
    return " ".join(text.lower().split())


def _json(path: Path) -> list:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise VerifierError(f"cannot read the question set {path}: {exc}") from None


def split_of(q1: str, q2: str, seed: int) -> str:
    """The pair's split, fixed by its two texts (in either order) and the seed."""
    first, second = sorted((_key(q1), _key(q2)))
    digest = hashlib.sha256(f"{seed}\n{first}\n{second}".encode()).digest()
    share = int.from_bytes(digest[:8], "big") / 2 ** 64
    for name, part in SPLITS:
        if share < part:
            return name
        share -= part
    return SPLITS[-1][0]


def mine(questions: list[Question], vectors: np.ndarray, low: float, per_question: int,
         block: int = 1024) -> list[dict]:
    """Each question's ``per_question`` nearest others with a cosine of at least ``low``
    (unit ``vectors``, one row per question), each unordered pair once."""
    pairs: dict[tuple[int, int], float] = {}
    for start in range(0, len(questions), block):
        sims = vectors[start:start + block] @ vectors.T
        rows = np.arange(sims.shape[0])
        sims[rows, rows + start] = -1.0  # never itself
        take = min(per_question, len(questions) - 1)
        if take <= 0:
            break
        nearest = np.argpartition(-sims, take - 1, axis=1)[:, :take]
        for row, columns in enumerate(nearest):
            for column in columns:
                cosine = float(sims[row, column])
                if cosine >= low:
                    pairs[tuple(sorted((start + row, int(column))))] = cosine
    return [{"q1": questions[a].text, "q2": questions[b].text, "cosine": round(c, 6),
             "sources": [questions[a].source, questions[b].source]}
            for (a, b), c in sorted(pairs.items())]


def sample_sources(questions: list[Question], per_source: int | None, seed: int
                   ) -> list[Question]:
    """At most ``per_source`` questions of each source, a seeded sample in their first
    order; a larger cap's sample holds every smaller one's (each source's seeded order,
    cut)."""
    if per_source is None:
        return questions
    kept: set[int] = set()
    for source in dict.fromkeys(q.source for q in questions):
        indices = [i for i, q in enumerate(questions) if q.source == source]
        random.Random(f"{seed}:{source}").shuffle(indices)
        kept.update(indices[:per_source])
    return [q for i, q in enumerate(questions) if i in kept]


def shards_dir(out: Path) -> Path:
    """Where ``mine_pairs`` keeps the embeddings of the run writing ``out``."""
    return out.with_name(f"{out.stem}.embeddings")


def mine_pairs(data_root: Path, out: Path, encode: Callable[[list[str]], np.ndarray],
               space: str, low: float = RECALL_TAU, per_question: int = 2,
               limit: int = 50_000, max_chars: int = 300, seed: int = 0,
               exclude: tuple[Path, ...] = (), per_source: int | None = None,
               chunk: int = 512, progress: Progress | None = None) -> dict:
    """Mine, sample ``limit`` pairs with the seed, split and write them (JSONL, atomically,
    in a seeded order so that any first rows are a sample of all); returns the counts
    written beside them in ``<out>.json``. ``space`` names the encoder's vector space (the
    shards of another are refused); ``chunk``: questions embedded per shard."""
    questions = sample_sources(question_sets(data_root, max_chars, exclude), per_source, seed)
    vectors, reused = embed_resumably([q.text for q in questions], encode, shards_dir(out),
                                      space, chunk, progress)
    pairs = mine(questions, vectors, low, per_question)
    order = np.random.default_rng(seed).permutation(len(pairs))[:limit]
    pairs = [pairs[i] for i in order]
    for pair in pairs:
        pair["split"] = split_of(pair["q1"], pair["q2"], seed)
    write_atomic(out, "".join(json.dumps(p) + "\n" for p in pairs))  # ASCII: one row a line
    sources: dict[str, int] = {}
    for q in questions:
        sources[q.source] = sources.get(q.source, 0) + 1
    summary = {"pairs": len(pairs), "questions": sources, "per_source": per_source,
               "band_from": low, "per_question": per_question, "max_chars": max_chars,
               "seed": seed, "excluded": [str(path) for path in exclude],
               "embeddings": {"dir": str(shards_dir(out)), "space": space,
                              "reused": reused, "embedded": len(questions) - reused},
               "splits": {name: sum(p["split"] == name for p in pairs) for name, _ in SPLITS},
               "pair_sources": _pair_sources(pairs)}
    write_atomic(out.with_suffix(".json"), json.dumps(summary, indent=2) + "\n")
    return summary


def sources_key(pair: dict) -> str:
    """The sets a pair's two questions came from, in one order ("arena + qqp-train")."""
    return " + ".join(sorted(pair["sources"]))


def _pair_sources(pairs: list[dict]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for pair in pairs:
        key = sources_key(pair)
        counts[key] = counts.get(key, 0) + 1
    return counts
