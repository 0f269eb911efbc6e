"""Embeddings kept in checkpointed shards, so that embedding a hundred thousand questions
(hours on a shared CPU) survives being stopped: each chunk of texts is written, atomically,
as one ``shard-NNNNN.npz`` (its texts and their vectors) in a directory whose
``space.json`` names the vector space, and a rerun embeds only the texts no shard holds.

Texts key the vectors, so a rerun over a larger sample (a higher per-source cap) reuses
every vector already made; chunks are cut from the texts still missing, in order, so a run
resumed after a kill embeds the same chunks as one that never stopped."""

import json
import re
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.files import atomic_write, write_atomic
from meancache.shared.progress import Progress

SPACE_FILE = "space.json"
SHARD = re.compile(r"shard-(\d{5})\.npz")


def embed_resumably(texts: list[str], encode: Callable[[list[str]], np.ndarray],
                    directory: Path, space: str, chunk: int = 512,
                    progress: Progress | None = None) -> tuple[np.ndarray, int]:
    """Unit vectors of ``texts`` (one row each), those of earlier runs read from
    ``directory``'s shards and the rest embedded ``chunk`` at a time, each chunk a new
    shard; returns the vectors and how many were read rather than embedded."""
    known = _load(directory, space)
    missing = list(dict.fromkeys(t for t in texts if t not in known))
    reused = len(set(texts)) - len(missing)
    total = reused + len(missing)
    if progress is not None:
        progress(reused, total)
    index = _next_index(directory)
    for start in range(0, len(missing), chunk):
        part = missing[start:start + chunk]
        vectors = np.asarray(encode(part), dtype=np.float32)
        if vectors.shape[0] != len(part):
            raise VerifierError(f"the encoder returned {vectors.shape[0]} vectors for "
                                f"{len(part)} texts")
        with atomic_write(directory / f"shard-{index:05d}.npz") as fh:
            # texts as JSON bytes: NumPy's own strings drop trailing NULs
            np.savez(fh, texts=np.frombuffer(json.dumps(part).encode(), dtype=np.uint8),
                     vectors=vectors)
        known.update(zip(part, vectors, strict=True))
        index += 1
        if progress is not None:
            progress(reused + start + len(part), total)
    if not texts:
        return np.empty((0, 0), dtype=np.float32), 0
    return np.stack([known[t] for t in texts]), reused


def _load(directory: Path, space: str) -> dict[str, np.ndarray]:
    """Every shard's vectors by text; the directory is made (and its space named) when
    new, and refused when its shards are of another space."""
    directory.mkdir(parents=True, exist_ok=True)
    named = directory / SPACE_FILE
    if not named.is_file():
        write_atomic(named, json.dumps({"space": space}) + "\n")
    try:
        theirs = json.loads(named.read_text(encoding="utf-8"))["space"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise VerifierError(f"cannot read {named} ({exc}); remove {directory} to embed "
                            "again") from None
    if theirs != space:
        raise VerifierError(f"the embeddings in {directory} are of another vector space "
                            f"({theirs}, not {space}); remove the directory or write to "
                            "another --out")
    known: dict[str, np.ndarray] = {}
    for path in sorted(directory.glob("shard-*.npz")):
        if SHARD.fullmatch(path.name) is None:
            continue
        try:
            with np.load(path, allow_pickle=False) as shard:
                texts = json.loads(shard["texts"].tobytes().decode())
                vectors = shard["vectors"]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as exc:
            raise VerifierError(f"the embedding shard {path} cannot be read ({exc}); remove "
                                "it and its texts are embedded again") from None
        if not isinstance(texts, list) or vectors.ndim != 2 or len(texts) != len(vectors) or (
                known and vectors.shape[1] != next(iter(known.values())).shape[0]):
            raise VerifierError(f"the embedding shard {path} does not hold one vector of "
                                "the others' size per text; remove it and its texts are "
                                "embedded again")
        known.update(zip(texts, vectors, strict=True))
    return known


def _next_index(directory: Path) -> int:
    numbers = [int(m.group(1)) for p in directory.iterdir()
               if (m := SHARD.fullmatch(p.name)) is not None]
    return max(numbers, default=-1) + 1
