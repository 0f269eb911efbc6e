"""Helpers shared by the benchmark scripts: data paths, data loading, deterministic
sampling, the encoder, an on-disk embedding cache, latency percentiles and table output.

Nothing here writes inside the repository: embeddings and the exported ONNX model are
cached under ``--cache-dir`` (default ``~/.cache/meancache-bench``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import random
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import platformdirs
from rich import box
from rich.console import Console
from rich.table import Table

if TYPE_CHECKING:
    from meancache.shared.encoder import Encoder, PCAProjection
    from meancache.shared.verifier.decision import LearnedDecision

REPO_ROOT = Path(__file__).resolve().parents[1]
# The data lives beside the project, read-only: ../shared/data relative to the repo root.
DEFAULT_DATA_DIR = REPO_ROOT.parent / "shared" / "data"
DEFAULT_CACHE_DIR = Path(platformdirs.user_cache_dir("meancache-bench"))

T = TypeVar("T")

console = Console(width=200, highlight=False, soft_wrap=True)
_stderr = Console(stderr=True, width=200, highlight=False)


# command line -------------------------------------------------------------------------
class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows defaults, except for options whose default depends on --quick (None)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if action.default is None or action.default is False:
            return action.help or ""
        return super()._get_help_string(action) or ""


def base_parser(description: str | None) -> argparse.ArgumentParser:
    """A parser with the options every benchmark has."""
    parser = argparse.ArgumentParser(
        description=(description or "").split("\n\n")[0], formatter_class=_HelpFormatter,
    )
    parser.add_argument("--data-dir", type=Path, default=DEFAULT_DATA_DIR,
                        help="the read-only shared data directory")
    parser.add_argument("--cache-dir", type=Path, default=DEFAULT_CACHE_DIR,
                        help="where the exported ONNX model and computed embeddings are kept")
    parser.add_argument("--seed", type=int, default=0, help="seed of every random choice")
    parser.add_argument("--quick", action="store_true",
                        help="a small, fast version (smoke test)")
    return parser


def note(message: str) -> None:
    """Progress messages go to stderr so that stdout holds only the results."""
    _stderr.print(f"[dim]{message}[/dim]")


# data ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class QQPPair:
    q1: str
    q2: str
    label: int
    split: str


def load_qqp(data_dir: Path, split: str | None = None) -> list[QQPPair]:
    """Rows of qqp/pairs.jsonl in file order, optionally of one split ("train" or "dev")."""
    pairs = []
    with (data_dir / "qqp" / "pairs.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if split is None or row["split"] == split:
                pairs.append(QQPPair(row["q1"], row["q2"], int(row["label"]), row["split"]))
    return pairs


def load_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


def sample(items: Sequence[T], n: int | None, seed: int) -> list[T]:
    """A deterministic sample of n items, kept in their original order (all if n is None
    or at least len(items))."""
    if n is None or n >= len(items):
        return list(items)
    chosen = sorted(random.Random(seed).sample(range(len(items)), n))
    return [items[i] for i in chosen]


def unique(texts: Iterable[str]) -> list[str]:
    """Distinct texts in first-seen order."""
    return list(dict.fromkeys(texts))


def qqp_questions(pairs: Iterable[QQPPair]) -> list[str]:
    """The distinct question texts of some pairs (q1 and q2)."""
    return unique(q for p in pairs for q in (p.q1, p.q2))


# encoder ------------------------------------------------------------------------------
def load_encoder(backend: str, cache_dir: Path, pca: PCAProjection | None = None,
                 model: str | None = None) -> Encoder:
    """The encoder ``model`` (a profile or a local directory; default: the packaged
    all-MiniLM-L6-v2) with a PCA layer if given, on ``backend``; the ONNX export and an
    assembled MPNet are cached in cache_dir.

    Loads afresh instead of calling ``Encoder.with_pca``, which switches a PyTorch encoder
    to ONNX.
    """
    logging.getLogger("torch.onnx").setLevel(logging.ERROR)  # export chatter
    from meancache.shared.encoder import Encoder, locate_model

    started = time.perf_counter()
    model_dir = locate_model(model, cache_dir / "models")
    encoder = Encoder.load(model_dir, pca=pca, backend=backend, cache_dir=cache_dir)
    if encoder.backend != backend:
        raise SystemExit(f"asked for the {backend} backend but got {encoder.backend}: "
                         f"{encoder.fallback_reason}")
    note(f"encoder {encoder.version} ({encoder.backend}, {encoder.dim}-d) ready in "
         f"{time.perf_counter() - started:.1f} s")
    return encoder


def embed_cached(encoder: Encoder, texts: Sequence[str], cache_dir: Path,
                 batch_size: int = 64) -> np.ndarray:
    """``encoder.encode(texts)``, kept in a .npy file keyed by the texts, the encoder version
    and its precision.

    float32 vectors do not depend on the backend (ONNX passes a parity check against
    PyTorch, cosine 0.999), so either fills the cache; int8 ones differ more (0.99) and are
    kept apart, so that a comparison of the two never reads one for the other.
    """
    space = encoder.version + ("-int8" if encoder.backend == "onnx-int8" else "")
    digest = hashlib.sha256(space.encode())
    for text in texts:
        digest.update(text.encode("utf-8", "surrogatepass") + b"\0")
    path = cache_dir / "embeddings" / f"{space}-{digest.hexdigest()[:20]}.npy"
    if path.is_file():
        vectors = np.load(path)
        if vectors.shape == (len(texts), encoder.dim):
            return vectors
    note(f"embedding {len(texts):,} texts with {encoder.backend} (cached for next time) ...")
    started = time.perf_counter()
    vectors = encoder.encode(list(texts), batch_size=batch_size)
    note(f"  done in {time.perf_counter() - started:.1f} s")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with tmp.open("wb") as fh:
        np.save(fh, vectors)
    tmp.replace(path)
    return vectors


def distinct_requests(questions: list[str], encoder: Encoder, cache_dir: Path, at: float
                      ) -> list[str]:
    """``questions`` less each one whose cosine to an earlier kept one reaches ``at``:
    Arena's users often send the same request ("Tell me a dad joke", "tell me a dad
    joke"; "Hi, how are you?", "Hello, how are you?"), which the stream counts as two
    questions with different answers, so a cache answering one with the other would be
    scored wrong where it is right."""
    if at >= 1:
        return questions
    vectors = embed_cached(encoder, questions, cache_dir)
    kept: list[int] = []
    for i, vector in enumerate(vectors):
        if not kept or float((vectors[kept] @ vector).max()) < at:
            kept.append(i)
    note(f"{len(kept)} of {len(questions)} questions kept as distinct requests "
         f"(cosine under {at} to every earlier one)")
    return [questions[i] for i in kept]


def first_threshold(decision: LearnedDecision, max_wrong_rate: float | None = None) -> float:
    """Where a new device's bound starts on ``decision``'s score: the bound on its card's
    own labels alone (client/learning/state.py), at ``max_wrong_rate`` (unset: the
    setting's default)."""
    import tempfile

    from meancache.client.cache.settings import CacheSettings
    from meancache.client.cache.store import EntryStore
    from meancache.client.learning.bound import Judge
    from meancache.client.learning.state import Learned

    rate = CacheSettings().max_wrong_rate if max_wrong_rate is None else max_wrong_rate
    with tempfile.TemporaryDirectory(prefix="meancache-first-threshold-") as tmp:
        store = EntryStore(Path(tmp))
        try:
            learned = Learned(store, rate)
            learned.use(Judge(decision.judge, decision.threshold, decision.evidence))
            return learned.bound.threshold
        finally:
            store.close()


def unit_rows(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length (float32)."""
    x = np.asarray(x, dtype=np.float32)
    return x / np.maximum(np.linalg.norm(x, axis=1, keepdims=True), 1e-12)


# timing -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Latency:
    """Percentiles of a set of timings, in milliseconds."""

    n: int
    p50: float
    p99: float
    mean: float

    @classmethod
    def of(cls, seconds: Sequence[float]) -> Latency:
        ms = np.asarray(seconds, dtype=np.float64) * 1000.0
        return cls(len(ms), float(np.percentile(ms, 50)), float(np.percentile(ms, 99)),
                   float(ms.mean()))


def time_each(fn: Callable[[T], object], items: Sequence[T], warmup: Sequence[T] = ()
                 ) -> Latency:
    """Call fn on each item and time each call; the warm-up calls are not timed."""
    for item in warmup:
        fn(item)
    seconds = []
    for item in items:
        started = time.perf_counter()
        fn(item)
        seconds.append(time.perf_counter() - started)
    return Latency.of(seconds)


class Stopwatch:
    """Wall time since construction."""

    def __init__(self) -> None:
        self.started = time.perf_counter()

    @property
    def seconds(self) -> float:
        return time.perf_counter() - self.started


def machine_load() -> str:
    """CPU count and load averages: latency numbers mean little on a busy machine."""
    one, five, fifteen = os.getloadavg()
    return (f"{os.cpu_count()} CPUs, load average {one:.2f} / {five:.2f} / {fifteen:.2f} "
            "(1 / 5 / 15 min)")


# output -------------------------------------------------------------------------------
def make_table(columns: Sequence[str], right_from: int = 1) -> Table:
    """A plain-text (Markdown-style) table; columns from ``right_from`` on are right-aligned."""
    table = Table(box=box.MARKDOWN, show_edge=True, pad_edge=True)
    for i, name in enumerate(columns):
        table.add_column(name, justify="right" if i >= right_from else "left", no_wrap=True)
    return table


def heading(text: str) -> None:
    console.print()
    console.print(text)


def print_table(table: Table) -> None:
    console.print(table)


def fmt(value: float | None, digits: int = 3) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def pct(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{100 * value:.{digits}f}%"


def print_command() -> None:
    """What was run, so that a pasted table says how it was made."""
    console.print(f"command: python {' '.join(sys.argv)}".rstrip())


def apply_defaults(args: argparse.Namespace, full: dict[str, Any], quick: dict[str, Any]
                   ) -> argparse.Namespace:
    """Fill options left unset (None) with the full-run or the --quick value."""
    chosen = quick if args.quick else full
    for name, value in chosen.items():
        if getattr(args, name, None) is None:
            setattr(args, name, value)
    return args
