"""The cache's statistics read from its store alone, for `meancache cache stats`: loading
the encoder (seconds, and torch) to count entries would make the command slow."""

import numpy as np
from meancache.client.cache.entry import STORED_DTYPE
from meancache.client.cache.results import CacheStats
from meancache.client.cache.store import EntryStore


def stored_stats(store: EntryStore, global_threshold: float, backend: str) -> CacheStats:
    """Statistics without an encoder: the encoder version and size are those of the newest
    stored vectors, and entries stored under another version count as stale (the next
    start that loads the encoder re-embeds them). ``global_threshold`` is the configured
    one, used until the FL server sends its own; ``backend`` is the configured runtime."""
    entries = list(store.entries())
    newest = max(entries, key=lambda entry: entry.created, default=None)
    version = newest.encoder_version if newest is not None else "-"
    dim = int(newest.embedding.shape[0]) if newest is not None else 0
    pairs = store.pairs()
    positives = sum(1 for pair in pairs if pair["label"] == 1)
    local = store.get_meta("threshold.local")
    fl_threshold = float(store.get_meta("threshold.global", global_threshold))
    return CacheStats(
        entries=len(entries),
        bytes=sum(entry.nbytes for entry in entries),
        stale_entries=sum(1 for entry in entries if entry.encoder_version != version),
        hits=store.counter("hits"),
        misses=store.counter("misses"),
        rejections=store.counter("rejections"),
        evictions=store.counter("evictions"),
        tokens_saved=store.counter("tokens_saved"),
        threshold=float(local) if local is not None else fl_threshold,
        global_threshold=fl_threshold,
        local_threshold=None if local is None else float(local),
        labelled_positives=positives,
        labelled_negatives=len(pairs) - positives,
        encoder_version=version,
        encoder_backend=backend,
        embedding_dim=dim,
        bytes_per_embedding=dim * np.dtype(STORED_DTYPE).itemsize,
    )
