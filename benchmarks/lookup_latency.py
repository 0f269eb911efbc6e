"""Lookup latency (p50/p99 in ms) of the semantic cache at 1K to 1M entries, and the bytes
each stored embedding costs.

Tables:

1. search alone: ``VectorIndex.search(q, k=8, min_score=tau)`` (the cache's in-memory
   cosine search, as lookups call it: only entries above tau are ranked), and
   end to end = embedding one query + that search, for the onnx and torch encoder backends,
   full dims (384 MiniLM, 768 MPNet) and PCA-64, at each index size. Indexes up to
   --real-entries hold real QQP question embeddings; larger ones are filled with random
   unit vectors (building a real 1M store is too slow, and a brute-force search costs the
   same whatever the values).
2. embedding one query alone, per backend and dims.
3. a real ``SemanticCache.lookup()`` on an on-disk cache of --real-entries entries
   (default 10K: most through ``cache.store.put_many``, the last --insert-sample through
   ``SemanticCache.insert``, timed), for re-asked stored questions (hits: embedding,
   search, DiskCache read and the hit's bookkeeping writes) and unseen questions (mostly
   misses), full dims and after ``fit_pca()`` (PCA-64).
4. bytes per stored embedding (float16 on disk) against the full float32 vector (1,536
   bytes for MiniLM, 3,072 for MPNet).

Query texts are distinct QQP dev questions (short, typical questions) that are not in the
index; every timed cell uses the same --queries texts after --warmup untimed ones, and
nothing memoises encoder outputs between calls. Targets: p50 end to end at 10K <= 5 ms
for MiniLM, <= 12 ms for MPNet; search alone <= 15 ms at 1M; at least 83% fewer embedding
bytes than the full float32 vector.

Latency on a 2-core machine depends on everything else running on it: the load average is
printed at the start and the end. --blas-threads 1 limits numpy's BLAS thread pool while
timing, to see how much of an end-to-end lookup is lost to onnxruntime's and OpenBLAS's
thread pools competing for the same cores (the cache's own search already limits BLAS to
one thread, and its onnxruntime session does not spin).

Run from the repository root (the full run takes several minutes; needs ~4 GB of RAM):

    python benchmarks/lookup_latency.py
    python benchmarks/lookup_latency.py --quick
    python benchmarks/lookup_latency.py --sizes 1000 10000 --queries 500
    python benchmarks/lookup_latency.py --plot docs/lookup_latency.png   # and a chart
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from _common import (
    Latency,
    Stopwatch,
    apply_defaults,
    base_parser,
    console,
    embed_cached,
    heading,
    load_encoder,
    load_qqp,
    machine_load,
    make_table,
    note,
    pct,
    print_command,
    print_table,
    qqp_questions,
    sample,
    time_each,
    unit_rows,
)
from _plot import add_plot_option, line_chart
from meancache.client.cache import CacheSettings, Context, Entry, Hit, SemanticCache
from meancache.client.cache.entry import STORED_DTYPE
from meancache.client.cache.index import VectorIndex
from meancache.shared.encoder import BACKENDS, DEFAULT_PCA_DIMS, Encoder, PCAProjection
from meancache.shared.threshold import DEFAULT_THRESHOLD
from threadpoolctl import threadpool_info, threadpool_limits

# p50 end to end at 10K entries, by full embedding size (MiniLM 384, MPNet 768)
TARGET_E2E_P50_MS = {384: 5.0, 768: 12.0}
TARGET_SEARCH_1M_MS = 15.0
TARGET_SAVED = 0.83
FILL_CHUNK = 100_000


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+",
                        help="index sizes (default: 1000 10000 100000 1000000; --quick "
                             "1000 10000)")
    parser.add_argument("--queries", type=int,
                        help="timed queries per cell (default 200, --quick 20)")
    parser.add_argument("--warmup", type=int, help="untimed queries first (default 20, --quick 5)")
    parser.add_argument("--k", type=int, default=CacheSettings().candidates,
                        help="neighbours per search (the cache's candidates)")
    parser.add_argument("--backends", nargs="+", choices=BACKENDS,
                        default=["onnx", "torch"], help="encoder backends to time")
    parser.add_argument("--pca-dims", type=int, default=DEFAULT_PCA_DIMS,
                        help="dimensions kept by PCA")
    parser.add_argument("--pca-fit", type=int,
                        help="entry texts the PCA layer is fitted on (default 1000, --quick 300)")
    parser.add_argument("--real-entries", type=int,
                        help="entries of the real on-disk cache (default 10000, --quick "
                             "300); also the largest index filled with real embeddings")
    parser.add_argument("--insert-sample", type=int,
                        help="entries stored through SemanticCache.insert (timed; default "
                             "200, --quick 20)")
    parser.add_argument("--answer-chars", type=int, default=1000,
                        help="length of the synthetic cached answers")
    parser.add_argument("--encoder", default="minilm",
                        help="encoder profile ('minilm', 'mpnet') or a local model directory "
                             "(default: %(default)s)")
    parser.add_argument("--no-verify-hits", action="store_true",
                        help="time the real cache's lookups without the verification step "
                             "(CacheSettings.verify_hits), to measure what it costs")
    parser.add_argument("--blas-threads", type=int, default=0,
                        help="limit numpy's BLAS threads while timing (0: leave the library "
                             "default, as the cache runs)")
    add_plot_option(parser)
    args = parser.parse_args()
    return apply_defaults(
        args,
        full={"sizes": [1_000, 10_000, 100_000, 1_000_000], "queries": 200, "warmup": 20,
              "pca_fit": CacheSettings().pca_min_entries, "real_entries": 10_000,
              "insert_sample": 200},
        quick={"sizes": [1_000, 10_000], "queries": 20, "warmup": 5, "pca_fit": 300,
               "real_entries": 300, "insert_sample": 20},
    )


# workload ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Workload:
    entry_texts: list[str]  # distinct QQP train questions: what the caches hold
    entry_vectors: np.ndarray  # their full unit embeddings
    warmup_texts: list[str]  # distinct QQP dev questions, not among the entries
    query_texts: list[str]
    pca: PCAProjection

    def vectors(self, dims: int, full: np.ndarray) -> np.ndarray:
        """``full`` unit vectors in the space of ``dims`` (full or PCA)."""
        return full if dims == full.shape[1] else unit_rows(self.pca.project(full))


def load_workload(args: argparse.Namespace, encoder: Encoder) -> Workload:
    train = qqp_questions(load_qqp(args.data_dir, "train"))
    entries = sample(train, args.real_entries, args.seed)
    stored = set(entries)
    dev = [q for q in qqp_questions(load_qqp(args.data_dir, "dev")) if q not in stored]
    probes = sample(dev, args.warmup + args.queries, args.seed)
    vectors = embed_cached(encoder, entries, args.cache_dir)
    fit_rows = sample(range(len(entries)), args.pca_fit, args.seed)
    pca = PCAProjection.fit(vectors[fit_rows], args.pca_dims)
    return Workload(entries, vectors, probes[: args.warmup], probes[args.warmup:], pca)


def load_encoders(args: argparse.Namespace, pca: PCAProjection
                  ) -> dict[tuple[str, int], Encoder]:
    """(backend, dims) -> encoder, for every backend, full and PCA."""
    encoders = {}
    for backend in args.backends:
        for layer in (None, pca):
            encoder = load_encoder(backend, args.cache_dir, layer, args.encoder)
            encoders[backend, encoder.dim] = encoder
    return encoders


# timing cells -------------------------------------------------------------------------
def random_unit(n: int, dim: int, rng: np.random.Generator) -> np.ndarray:
    return unit_rows(rng.standard_normal((n, dim), dtype=np.float32))


def fill_index(size: int, dim: int, real: np.ndarray, seed: int) -> tuple[VectorIndex, str]:
    """An index of ``size`` vectors: the real ones first, then random unit vectors."""
    index = VectorIndex(dim)
    rng = np.random.default_rng(seed)
    n_real = min(size, len(real))
    index.add_many([f"r{i}" for i in range(n_real)], real[:n_real])
    for start in range(n_real, size, FILL_CHUNK):
        stop = min(size, start + FILL_CHUNK)
        index.add_many([f"x{i}" for i in range(start, stop)], random_unit(stop - start, dim, rng))
    kind = "real" if n_real == size else f"{n_real:,} real + random"
    return index, kind


def end_to_end(index: VectorIndex, encoder: Encoder, k: int) -> Callable[[str], object]:
    return lambda text: index.search(encoder.encode([text])[0], k, min_score=DEFAULT_THRESHOLD)


@dataclass(frozen=True)
class ScaleRow:
    dims: int
    size: int
    vectors: str
    build_s: float
    search: Latency
    e2e: dict[str, Latency]  # backend -> latency


def measure_size(dims: int, size: int, work: Workload, query_vectors: np.ndarray,
                 encoders: dict[tuple[str, int], Encoder], args: argparse.Namespace
                 ) -> ScaleRow:
    clock = Stopwatch()
    index, kind = fill_index(size, dims, work.vectors(dims, work.entry_vectors), args.seed)
    build_s = clock.seconds
    warm, timed = query_vectors[: args.warmup], query_vectors[args.warmup:]
    search = time_each(lambda q: index.search(q, args.k, min_score=DEFAULT_THRESHOLD), timed,
                       warm)
    e2e = {
        backend: time_each(end_to_end(index, encoders[backend, dims], args.k),
                           work.query_texts, work.warmup_texts)
        for backend in args.backends
    }
    note(f"  {dims}-d x {size:,}: search p50 {search.p50:.2f} ms "
         f"(built in {build_s:.1f} s)")
    return ScaleRow(dims, size, kind, build_s, search, e2e)


def scaling_rows(work: Workload, encoders: dict[tuple[str, int], Encoder],
                 args: argparse.Namespace) -> list[ScaleRow]:
    probes = work.warmup_texts + work.query_texts
    full_dim = work.entry_vectors.shape[1]
    full_queries = embed_cached(encoders[args.backends[0], full_dim], probes, args.cache_dir)
    rows = []
    for dims in (args.pca_dims, full_dim):
        queries = work.vectors(dims, full_queries)
        for size in args.sizes:
            rows.append(measure_size(dims, size, work, queries, encoders, args))
    return rows


def embedding_rows(work: Workload, encoders: dict[tuple[str, int], Encoder]
                   ) -> list[tuple[str, int, Latency]]:
    return [
        (backend, dims, time_each(lambda t, e=enc: e.encode([t]), work.query_texts,
                                  work.warmup_texts))
        for (backend, dims), enc in encoders.items()
    ]


# the real on-disk cache ---------------------------------------------------------------
def synthetic_answer(query: str, chars: int) -> str:
    text = f"An answer to: {query} "
    return (text * (chars // len(text) + 1))[:chars]


@dataclass(frozen=True)
class Fill:
    put_many_s: float  # all but the last --insert-sample entries, through store.put_many
    open_s: float  # opening the cache then (loads every stored entry into the index)
    insert: Latency  # the last entries, through SemanticCache.insert into the full cache
    disk_bytes: int


def fill_real_cache(directory: Path, encoder: Encoder, work: Workload,
                    args: argparse.Namespace) -> Fill:
    """Bulk-store most entries, reopen, then insert the first --insert-sample one by one."""
    settings = CacheSettings(pca_dims=0)
    texts = work.entry_texts
    answers = [synthetic_answer(q, args.answer_chars) for q in texts]
    n_insert = min(args.insert_sample, len(texts))
    clock = Stopwatch()
    with SemanticCache(directory, encoder, settings) as cache:
        for start in range(n_insert, len(texts), 1000):
            stop = min(start + 1000, len(texts))
            cache.store.put_many([
                Entry(query=q, answer=a, embedding=v.astype(STORED_DTYPE),
                      encoder_version=encoder.version, query_tokens=encoder.count_tokens(q),
                      answer_tokens=encoder.count_tokens(a))
                for q, a, v in zip(texts[start:stop], answers[start:stop],
                                   work.entry_vectors[start:stop], strict=True)
            ])
    put_many_s = clock.seconds
    clock = Stopwatch()
    with SemanticCache(directory, encoder, settings) as cache:
        open_s = clock.seconds
        pairs = list(zip(texts[:n_insert], answers[:n_insert], strict=True))
        insert = time_each(lambda qa: cache.insert(qa[0], qa[1], Context()), pairs)
    disk = sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())
    return Fill(put_many_s, open_s, insert, disk)


@dataclass(frozen=True)
class LookupRow:
    setting: str
    probes: str
    latency: Latency
    hits: int


def time_lookups(cache: SemanticCache, setting: str, work: Workload,
                 args: argparse.Namespace) -> list[LookupRow]:
    n = len(work.query_texts)
    # Re-asked stored questions from the put_many part (not memoised by the cache).
    stored = work.entry_texts[args.insert_sample:][-(n + args.warmup):]
    probes = {"stored question re-asked": stored,
              "unseen question": work.warmup_texts + work.query_texts}
    rows = []
    for label, texts in probes.items():
        results: list[object] = []
        latency = time_each(recording_lookup(cache, results), texts[args.warmup:],
                            texts[: args.warmup])
        hits = sum(isinstance(r, Hit) for r in results[args.warmup:])
        rows.append(LookupRow(setting, label, latency, hits))
    return rows


def recording_lookup(cache: SemanticCache, results: list[object]) -> Callable[[str], None]:
    """A first-turn lookup that keeps its result (to count hits after timing)."""
    return lambda text: results.append(cache.lookup(text, Context()))


def real_cache(encoder: Encoder, work: Workload, args: argparse.Namespace
               ) -> tuple[Fill, list[LookupRow], dict[str, int], float]:
    """Fill a real cache, time lookups at full dims, then fit PCA and time them again."""
    with tempfile.TemporaryDirectory(prefix="meancache-bench-") as tmp:
        directory = Path(tmp) / "cache"
        note(f"filling a real cache with {len(work.entry_texts):,} entries ...")
        fill = fill_real_cache(directory, encoder, work, args)
        bytes_per = {}
        verify_hits = not args.no_verify_hits
        with SemanticCache(directory, encoder, CacheSettings(pca_dims=0,
                                                             verify_hits=verify_hits)) as cache:
            rows = time_lookups(cache, f"full {encoder.dim}-d", work, args)
            bytes_per["full"] = stored_embedding_bytes(cache)
        note("fitting PCA in the real cache (projects every stored vector) ...")
        with SemanticCache(directory, encoder, CacheSettings(pca_dims=args.pca_dims,
                                                             verify_hits=verify_hits)) as cache:
            clock = Stopwatch()
            cache.fit_pca()
            fit_s = clock.seconds
            rows += time_lookups(cache, f"PCA-{args.pca_dims}", work, args)
            bytes_per["pca"] = stored_embedding_bytes(cache)
    return fill, rows, bytes_per, fit_s


def stored_embedding_bytes(cache: SemanticCache) -> int:
    """Bytes of one entry's embedding as read back from the store (checked against stats)."""
    stored = next(cache.store.entries()).embedding.nbytes
    reported = cache.stats().bytes_per_embedding
    if stored != reported:
        note(f"warning: stats() says {reported} bytes per embedding, the store holds {stored}")
    return stored


# output -------------------------------------------------------------------------------
def ms(latency: Latency) -> tuple[str, str]:
    return f"{latency.p50:.2f}", f"{latency.p99:.2f}"


def print_scaling(rows: list[ScaleRow], backends: Sequence[str], args: argparse.Namespace
                  ) -> None:
    heading(f"Search alone and end to end (embed 1 query + search k={args.k}), ms over "
            f"{args.queries} queries after {args.warmup} warm-up")
    columns = ["dims", "entries", "index vectors", "add_many s", "search p50", "search p99"]
    for backend in backends:
        columns += [f"{backend} e2e p50", f"{backend} e2e p99"]
    table = make_table(columns, right_from=1)
    for row in rows:
        cells = [str(row.dims), f"{row.size:,}", row.vectors, f"{row.build_s:.1f}",
                 *ms(row.search)]
        for backend in backends:
            cells += ms(row.e2e[backend])
        table.add_row(*cells)
    print_table(table)


def print_embedding(rows: list[tuple[str, int, Latency]], work: Workload) -> None:
    chars = np.mean([len(t) for t in work.query_texts])
    heading(f"Embedding one query alone (ms; queries average {chars:.0f} characters)")
    table = make_table(["backend", "dims", "p50", "p99", "mean"], right_from=1)
    for backend, dims, lat in rows:
        table.add_row(backend, str(dims), *ms(lat), f"{lat.mean:.2f}")
    print_table(table)


def print_real(fill: Fill, rows: list[LookupRow], fit_s: float, encoder: Encoder,
               work: Workload, args: argparse.Namespace) -> None:
    n = len(work.entry_texts)
    heading(f"SemanticCache.lookup() on a real on-disk cache of {n:,} entries "
            f"({encoder.backend}, tau {CacheSettings().global_threshold}, verification "
            f"{'off' if args.no_verify_hits else 'on'})")
    table = make_table(["vectors", "probes", "queries", "hits", "p50 ms", "p99 ms", "mean ms"],
                       right_from=2)
    for row in rows:
        table.add_row(row.setting, row.probes, str(row.latency.n), str(row.hits),
                      *ms(row.latency), f"{row.latency.mean:.2f}")
    print_table(table)
    bulk = n - fill.insert.n
    console.print(
        f"fill: {bulk:,} entries via store.put_many (embeddings precomputed) "
        f"in {fill.put_many_s:.1f} s; reopening the cache (loads {bulk:,} entries) "
        f"{fill.open_s:.2f} s; then {fill.insert.n} x SemanticCache.insert: p50 "
        f"{fill.insert.p50:.1f} ms, mean {fill.insert.mean:.1f} ms (so {n:,} inserts one by "
        f"one ~ {fill.insert.mean * n / 1000:.0f} s); fit_pca() (fit + project every entry) "
        f"{fit_s:.1f} s")
    console.print(f"on disk: {fill.disk_bytes / n:,.0f} bytes per entry with full vectors "
                  f"(DiskCache directory / entries; {args.answer_chars}-character answers)")


def print_bytes(bytes_per: dict[str, int], full_dim: int, args: argparse.Namespace) -> None:
    full_f32 = 4 * full_dim
    heading(f"Bytes per stored embedding ({np.dtype(STORED_DTYPE).name} on disk) vs "
            f"{full_dim} float32 values ({full_f32:,} bytes)")
    table = make_table(["vectors", "bytes per embedding", f"saved vs {full_f32:,}",
                        "follow-up entry (query + context vectors)"], right_from=1)
    for name, label in (("full", f"full {full_dim}-d"), ("pca", f"PCA-{args.pca_dims}")):
        b = bytes_per[name]
        table.add_row(label, f"{b:,}", pct(1 - b / full_f32), f"{2 * b:,}")
    print_table(table)


def print_targets(rows: list[ScaleRow], lookups: list[LookupRow], bytes_per: dict[str, int],
                  full_dim: int, args: argparse.Namespace) -> None:
    heading("Targets")
    target_ms = TARGET_E2E_P50_MS.get(full_dim, TARGET_E2E_P50_MS[768])
    checks = []
    for row in rows:
        if row.size == 10_000:
            for backend, lat in row.e2e.items():
                checks.append((f"e2e p50 <= {target_ms} ms at 10K ({row.dims}-d, "
                               f"{backend})", lat.p50, lat.p50 <= target_ms))
        if row.size == 1_000_000:
            checks.append((f"search alone p50 <= {TARGET_SEARCH_1M_MS} ms at 1M "
                           f"({row.dims}-d)", row.search.p50,
                           row.search.p50 <= TARGET_SEARCH_1M_MS))
    if args.real_entries == 10_000:
        for row in lookups:
            checks.append((f"SemanticCache.lookup p50 <= {target_ms} ms at 10K "
                           f"({row.setting}, {row.probes})", row.latency.p50,
                           row.latency.p50 <= target_ms))
    saved = 1 - bytes_per["pca"] / (4 * full_dim)
    checks.append((f"PCA-{args.pca_dims} embedding bytes >= {TARGET_SAVED:.0%} below "
                   f"{4 * full_dim:,}",
                   100 * saved, saved >= TARGET_SAVED))
    table = make_table(["target", "measured", "result"], right_from=1)
    for name, value, ok in checks:
        table.add_row(name, f"{value:.2f}", "meets" if ok else "MISSES")
    print_table(table)


def plot_scaling(rows: list[ScaleRow], args: argparse.Namespace, encoder: Encoder) -> None:
    """p50 against the number of entries: search alone and end to end, per dims."""
    by_dims = {dims: [row for row in rows if row.dims == dims] for dims in
               dict.fromkeys(row.dims for row in rows)}
    lines = {f"search alone, {dims}-d": ([r.size for r in mine], [r.search.p50 for r in mine])
             for dims, mine in by_dims.items()}
    for backend in args.backends:
        for dims, mine in by_dims.items():
            lines[f"embed 1 query ({backend}) + search, {dims}-d"] = (
                [r.size for r in mine], [r.e2e[backend].p50 for r in mine])
    line_chart(args.plot, "Semantic cache lookup latency against cache size (p50)",
               "entries in the cache", "p50 latency (ms)", lines, log_x=True, log_y=True,
               subtitle=f"{args.encoder} encoder ({encoder.full_dim}-d, PCA to "
                        f"{args.pca_dims}-d), k={args.k}, {args.queries} QQP dev queries "
                        f"per point; {machine_load()}")


def blas_threads() -> str:
    """numpy's BLAS library and its thread count now."""
    pools = [p for p in threadpool_info() if p["user_api"] == "blas"]
    return ", ".join(f"{p['internal_api']} {p['num_threads']}" for p in pools) or "unknown"


def main() -> None:
    args = parse_args()
    clock = Stopwatch()
    load_before = machine_load()
    base = load_encoder(args.backends[0], args.cache_dir, model=args.encoder)
    work = load_workload(args, base)
    encoders = load_encoders(args, work.pca)
    note("timing search and end-to-end lookups ...")
    limit = threadpool_limits(args.blas_threads, "blas") if args.blas_threads else nullcontext()
    with limit:
        blas = blas_threads()
        scale = scaling_rows(work, encoders, args)
        embed = embedding_rows(work, encoders)
        onnx = encoders.get(("onnx", base.dim), base)
        fill, lookups, bytes_per, fit_s = real_cache(onnx, work, args)

    console.print(f"encoder {base.version} ({args.encoder}, {base.dim}-d); "
                  f"PCA-{args.pca_dims} fitted on {args.pca_fit:,} entry texts; "
                  f"{len(work.query_texts)} distinct QQP dev questions timed per cell; "
                  f"numpy BLAS threads: {blas}")
    print_scaling(scale, args.backends, args)
    if args.plot:
        plot_scaling(scale, args, base)
    print_embedding(embed, work)
    print_real(fill, lookups, fit_s, onnx, work, args)
    print_bytes(bytes_per, base.full_dim, args)
    print_targets(scale, lookups, bytes_per, base.full_dim, args)
    console.print(f"machine: {load_before} at the start; {machine_load()} at the end")
    print_command()
    console.print(f"wall time: {clock.seconds:.1f} s")


if __name__ == "__main__":
    main()
