"""Match quality: precision, recall, F1, F0.5 and accuracy of "cosine >= tau means the same
question" on QQP, for full embeddings (384-d MiniLM, or 768-d MPNet with --encoder mpnet),
PCA-64 and a static tau of 0.7.

tau is tuned on the train split (maximising F0.5, as shared.threshold.best_threshold does)
and the scores are reported on the dev split:

- full-dim at its tuned tau, and at the profile's shipped default threshold;
- PCA-64 fitted on train-split question embeddings, with tau re-tuned in PCA space, for
  each --pca-fit size (the first is the headline; 1000 = when a real cache fits its PCA),
  plus PCA-64 at the full-space taus (SemanticCache.fit_pca keeps the cache's tau);
- a static tau of 0.7 on full embeddings (GPTCache's habit).

The last lines give ΔF0.5 = PCA-64 minus full with a paired bootstrap 95% interval
(target: PCA-64 costs at most 0.01 F0.5).

Embeddings are cached under --cache-dir, so only the first run pays for embedding
(~40K texts, a few minutes on 2 cores). Run from the repository root:

    python benchmarks/match_quality.py                   # 10,000 train pairs, all dev pairs
    python benchmarks/match_quality.py --quick           # small smoke test
    python benchmarks/match_quality.py --encoder mpnet   # MPNet (assembled on first use)
    python benchmarks/match_quality.py --train-pairs 54514 --pca-fit 1000 5000 0
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (
    QQPPair,
    Stopwatch,
    apply_defaults,
    base_parser,
    console,
    embed_cached,
    fmt,
    heading,
    load_encoder,
    load_qqp,
    make_table,
    note,
    print_command,
    print_table,
    qqp_questions,
    sample,
    unit_rows,
)
from meancache.client.cache import CacheSettings
from meancache.shared.encoder import (
    BACKENDS,
    DEFAULT_PCA_DIMS,
    Encoder,
    PCAProjection,
    profile_threshold,
)
from meancache.shared.threshold import (
    MatchScores,
    best_threshold,
    score_thresholds,
)

STATIC_TAU = 0.7  # GPTCache's usual similarity threshold
MAX_F05_LOSS = 0.01  # the target: PCA-64 may cost at most this much F0.5


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__)
    parser.add_argument("--train-pairs", type=int,
                        help="train pairs to tune tau on (deterministic sample; default 10000, "
                             "--quick 500)")
    parser.add_argument("--dev-pairs", type=int,
                        help="dev pairs to score on (default: all 9,636; --quick 500)")
    parser.add_argument("--pca-dims", type=int, default=DEFAULT_PCA_DIMS,
                        help="dimensions kept by PCA")
    parser.add_argument("--pca-fit", type=int, nargs="+",
                        help="train-sample question texts to fit PCA on, one row each; "
                             "0 = all of them (default: 1000 0; --quick 200 0)")
    parser.add_argument("--backend", choices=BACKENDS, default="onnx",
                        help="encoder backend that computes the embeddings")
    parser.add_argument("--encoder", default="minilm",
                        help="encoder profile ('minilm', 'mpnet') or a local model directory")
    parser.add_argument("--bootstrap", type=int,
                        help="paired bootstrap resamples for the ΔF0.5 interval (default "
                             "1000, --quick 200; 0: none)")
    parser.add_argument("--verify-texts", type=int,
                        help="texts on which projected vectors are checked against the "
                             "encoder's own PCA layer (default 32, --quick 8; 0: skip)")
    args = parser.parse_args()
    fit_default = [CacheSettings().pca_min_entries, 0]
    return apply_defaults(
        args,
        full={"train_pairs": 10_000, "dev_pairs": 0, "pca_fit": fit_default,
              "bootstrap": 1000, "verify_texts": 32},
        quick={"train_pairs": 500, "dev_pairs": 500, "pca_fit": [200, 0],
               "bootstrap": 200, "verify_texts": 8},
    )


# embeddings and similarities ------------------------------------------------------------
@dataclass(frozen=True)
class PairSet:
    """Labelled pairs with the embeddings of their distinct questions."""

    texts: list[str]
    vectors: np.ndarray  # (len(texts), dim) unit vectors, full space
    left: np.ndarray  # row of q1 in vectors, per pair
    right: np.ndarray  # row of q2
    labels: np.ndarray

    @classmethod
    def build(cls, pairs: list[QQPPair], encoder: Encoder, cache_dir: Path) -> PairSet:
        texts = qqp_questions(pairs)
        row = {t: i for i, t in enumerate(texts)}
        return cls(
            texts, embed_cached(encoder, texts, cache_dir),
            np.array([row[p.q1] for p in pairs]), np.array([row[p.q2] for p in pairs]),
            np.array([p.label for p in pairs], dtype=int),
        )

    def cosines(self, space: Callable[[np.ndarray], np.ndarray] | None = None) -> np.ndarray:
        """Cosine of each pair, in full space or after ``space`` (a projection to unit rows)."""
        vectors = self.vectors if space is None else space(self.vectors)
        return np.einsum("ij,ij->i", vectors[self.left], vectors[self.right])


def pca_space(pca: PCAProjection) -> Callable[[np.ndarray], np.ndarray]:
    """Full unit vectors -> the unit vectors the encoder's PCA layer would give."""
    return lambda x: unit_rows(pca.project(x))


def check_projection(encoder: Encoder, pca: PCAProjection, texts: list[str],
                     vectors: np.ndarray) -> float:
    """Smallest cosine between projected stored vectors and ``encoder.with_pca(pca)``."""
    direct = encoder.with_pca(pca).encode(texts)
    return float(np.einsum("ij,ij->i", pca_space(pca)(vectors), direct).min())


# rows ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Row:
    setting: str
    dims: int
    fit_texts: int | None
    tau_from: str
    train: MatchScores
    dev: MatchScores
    dev_cosines: np.ndarray


def tuned_row(setting: str, dims: int, fit: int | None, train_sims: np.ndarray,
              train: PairSet, dev_sims: np.ndarray, dev: PairSet) -> Row:
    best = best_threshold(train_sims, train.labels)
    scores = score_thresholds(dev_sims, dev.labels, np.array([best.threshold]))[0]
    return Row(setting, dims, fit, "tuned on train (max F0.5)", best, scores, dev_sims)


def fixed_row(setting: str, dims: int, fit: int | None, tau: float, tau_from: str,
              train_sims: np.ndarray, train: PairSet, dev_sims: np.ndarray,
              dev: PairSet) -> Row:
    tau_arr = np.array([tau])
    return Row(setting, dims, fit, tau_from,
               score_thresholds(train_sims, train.labels, tau_arr)[0],
               score_thresholds(dev_sims, dev.labels, tau_arr)[0], dev_sims)


def pca_rows(fit_sizes: list[int], train: PairSet, dev: PairSet, full_tau: float,
             args: argparse.Namespace) -> tuple[list[Row], list[PCAProjection]]:
    """One tuned row per fit size, then the first fit at full-space thresholds (a cache
    keeps its tau when it fits PCA)."""
    rows, fitted = [], []
    for size in fit_sizes:
        fit_rows = sample(range(len(train.texts)), size or None, args.seed)
        pca = PCAProjection.fit(train.vectors[fit_rows], args.pca_dims)
        space = pca_space(pca)
        rows.append(tuned_row(f"PCA-{args.pca_dims}", args.pca_dims, len(fit_rows),
                              train.cosines(space), train, dev.cosines(space), dev))
        fitted.append(pca)
    space = pca_space(fitted[0])
    train_sims, dev_sims = train.cosines(space), dev.cosines(space)
    for tau, tau_from in ((full_tau, "tuned full-space tau"),
                          (profile_threshold(args.encoder), "shipped default")):
        rows.append(fixed_row(f"PCA-{args.pca_dims}", args.pca_dims, rows[0].fit_texts, tau,
                              tau_from, train_sims, train, dev_sims, dev))
    return rows, fitted


# paired bootstrap -----------------------------------------------------------------------
def f05(predicted: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """F0.5 along the last axis of boolean predictions (rows of resamples)."""
    tp = (predicted & labels).sum(-1)
    fp = (predicted & ~labels).sum(-1)
    fn = (~predicted & labels).sum(-1)
    denom = 1.25 * tp + 0.25 * fn + fp
    return np.where(denom > 0, 1.25 * tp / np.maximum(denom, 1), 0.0)


def bootstrap_delta(a: Row, b: Row, labels: np.ndarray, resamples: int, seed: int
                    ) -> tuple[float, float]:
    """95% interval of F0.5(a) - F0.5(b) over dev pairs resampled with replacement."""
    rng = np.random.default_rng(seed)
    pred_a = a.dev_cosines >= a.dev.threshold
    pred_b = b.dev_cosines >= b.dev.threshold
    labs = labels.astype(bool)
    deltas = []
    for chunk in np.array_split(np.arange(resamples), max(1, resamples // 100)):
        idx = rng.integers(0, len(labs), size=(len(chunk), len(labs)))
        deltas.append(f05(pred_a[idx], labs[idx]) - f05(pred_b[idx], labs[idx]))
    low, high = np.percentile(np.concatenate(deltas), [2.5, 97.5])
    return float(low), float(high)


# output -------------------------------------------------------------------------------
def print_rows(rows: list[Row], reference: Row) -> None:
    table = make_table(["setting", "dims", "PCA fit texts", "tau", "tau from", "train F0.5",
                        "dev precision", "dev recall", "dev F1", "dev F0.5", "dev accuracy",
                        "ΔF0.5 vs full"], right_from=1)
    for row in rows:
        d = row.dev
        table.add_row(
            row.setting, str(row.dims), "-" if row.fit_texts is None else f"{row.fit_texts:,}",
            f"{d.threshold:.4f}", row.tau_from, fmt(row.train.f05), fmt(d.precision),
            fmt(d.recall), fmt(d.f1), fmt(d.f05), fmt(d.accuracy),
            "-" if row is reference else f"{d.f05 - reference.dev.f05:+.4f}",
        )
    print_table(table)


def print_verdict(pca: Row, full: Row, dev: PairSet, args: argparse.Namespace) -> None:
    delta = pca.dev.f05 - full.dev.f05
    verdict = "meets" if delta >= -MAX_F05_LOSS else "MISSES"
    line = (f"ΔF0.5 (PCA-{args.pca_dims} fit on {pca.fit_texts:,} texts, re-tuned) minus "
            f"(full-dim, tuned) on dev = {delta:+.4f}")
    if args.bootstrap:
        low, high = bootstrap_delta(pca, full, dev.labels, args.bootstrap, args.seed)
        line += f"  (paired bootstrap 95% interval [{low:+.4f}, {high:+.4f}])"
    console.print(line)
    console.print(f"target: PCA-{args.pca_dims} costs at most {MAX_F05_LOSS} F0.5 -> "
                  f"{verdict} the target")


def main() -> None:
    args = parse_args()
    clock = Stopwatch()
    train_pairs = sample(load_qqp(args.data_dir, "train"), args.train_pairs, args.seed)
    dev_pairs = sample(load_qqp(args.data_dir, "dev"), args.dev_pairs or None, args.seed)
    encoder = load_encoder(args.backend, args.cache_dir, model=args.encoder)
    train = PairSet.build(train_pairs, encoder, args.cache_dir)
    dev = PairSet.build(dev_pairs, encoder, args.cache_dir)
    note("tuning and scoring ...")

    full_train, full_dev = train.cosines(), dev.cosines()
    full = tuned_row("full", encoder.dim, None, full_train, train, full_dev, dev)
    shipped = fixed_row("full", encoder.dim, None, profile_threshold(args.encoder),
                        "shipped default", full_train, train, full_dev, dev)
    static = fixed_row("full", encoder.dim, None, STATIC_TAU, "static (GPTCache)",
                       full_train, train, full_dev, dev)
    pca, fitted = pca_rows(args.pca_fit, train, dev, full.dev.threshold, args)

    heading(f"Match quality on QQP: tau tuned on {len(train_pairs):,} train pairs "
            f"({int(train.labels.sum()):,} duplicates, {len(train.texts):,} distinct "
            f"questions), scored on {len(dev_pairs):,} dev pairs "
            f"({int(dev.labels.sum()):,} duplicates)")
    console.print(f"encoder {encoder.version} ({args.encoder}, {encoder.backend}); "
                  f"PCA fitted on a deterministic sample of the train-sample questions")
    print_rows([full, shipped, static, *pca], full)
    print_verdict(pca[0], full, dev, args)
    if args.verify_texts:
        cos = check_projection(encoder, fitted[0], dev.texts[: args.verify_texts],
                               dev.vectors[: args.verify_texts])
        console.print(f"check: projecting stored full vectors equals the encoder's own PCA "
                      f"layer (min cosine {cos:.6f} over {args.verify_texts} texts)")
    print_command()
    console.print(f"wall time: {clock.seconds:.1f} s")


if __name__ == "__main__":
    main()
