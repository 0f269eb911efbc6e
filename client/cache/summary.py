"""The cache's statistics. Counters, thresholds and feedback come from the store (through
their homes); what the encoder adds is passed in, so `meancache cache stats` can report
without loading the encoder (seconds, and torch) just to count entries."""


import numpy as np
from meancache.client.cache.entry import STORED_DTYPE
from meancache.client.cache.results import CacheStats
from meancache.client.cache.store import EntryStore
from meancache.client.cache.threshold import ThresholdState
from meancache.client.learning.bound import Bound, Judge, OwnLabels, labels_needed
from meancache.client.learning.explore import Exploration
from meancache.client.learning.state import Learned, recorded_learning_mode
from meancache.client.matching import labels, matcher
from meancache.client.matching.labels import DECLINED
from meancache.shared.fl.bound_evidence import cosine_judge
from meancache.shared.verifier.runtime import Card

EXPLORED = "explored"  # the counter of would-be hits also asked upstream (exploration)


def cache_stats(store: EntryStore, thresholds: ThresholdState, *, entries: int, nbytes: int,
                stale_entries: int, encoder_version: str, encoder_backend: str,
                embedding_dim: int, bound: Bound | None = None,
                max_wrong_rate: float | None = None,
                learns_from_answers: bool = True, warmup: int = 0,
                checked: OwnLabels | None = None) -> CacheStats:
    """``warmup``: the exploration's warm-up in force (0: none); ``checked``: this device's
    labels over the bound's threshold."""
    pairs = labels.labelled_pairs(store)
    positives = sum(pair.label for pair in pairs)
    checked = checked or OwnLabels(0, 0, True)
    return CacheStats(
        entries=entries,
        bytes=nbytes,
        stale_entries=stale_entries,
        hits=store.counter("hits"),
        misses=store.counter("misses"),
        rejections=store.counter("rejections"),
        evictions=store.counter("evictions"),
        tokens_saved=store.counter("tokens_saved"),
        tokens_upstream=store.counter("tokens_upstream"),
        declines=store.counters(DECLINED),
        explored=store.counter(EXPLORED),
        threshold=thresholds.current,
        global_threshold=thresholds.global_value,
        local_threshold=thresholds.local_value,
        labelled_positives=positives,
        labelled_negatives=len(pairs) - positives,
        encoder_version=encoder_version,
        encoder_backend=encoder_backend,
        embedding_dim=embedding_dim,
        bytes_per_embedding=embedding_dim * np.dtype(STORED_DTYPE).itemsize,
        wrong_rate=None if bound is None else bound.estimate,
        wrong_rate_upper=None if bound is None else bound.upper,
        wrong_rate_labels=0 if bound is None else bound.labels,
        wrong_rate_pooled=0 if bound is None else bound.pooled,
        max_wrong_rate=max_wrong_rate,
        wrong_rate_needs=None if bound is None or bound.learned or max_wrong_rate is None
        else labels_needed(max_wrong_rate),
        learns_from_answers=learns_from_answers,
        serves_from=None if bound is None or bound.closed else bound.threshold,
        wrong_rate_lower=None if bound is None else bound.lower,
        closed=bound is not None and bound.closed,
        warmup=warmup,
        checked=checked.labels,
        checked_wrong=checked.wrong,
        checked_within=checked.within_rate,
    )


def stored_stats(store: EntryStore, global_threshold: float, backend: str,
                 max_wrong_rate: float, verifier: Card | None,
                 learned_decision: bool = False, learns_by_settings: bool = True,
                 explore_rate: float | None = None, explore_warmup: int | None = None
                 ) -> CacheStats:
    """Statistics without an encoder: the encoder version and size are those of the newest
    stored vectors, and entries stored under another version count as stale (the next
    start that loads the encoder re-embeds them). ``global_threshold`` is the configured
    one, used until the FL server sends its own; ``backend`` is the configured runtime;
    ``verifier``: the card of the learned verifier that judges (client.verifier's: the
    device's global one or the shipped one), None where the cosine does;
    ``learned_decision``: whether the learned decision's card decides with it (the
    setting, with the encoder its card was fitted on), and so its score judges. Whether
    it learns from the upstream's answers is what the cache that last faced traffic on
    ``store`` did (the upstream it was started with decides it), else
    ``learns_by_settings`` (``Settings.learns_from_answers``); the warm-up is the one
    ``explore_rate`` and ``explore_warmup`` (the settings) give where it does."""
    entries = list(store.entries())
    newest = max(entries, key=lambda entry: entry.created, default=None)
    version = newest.encoder_version if newest is not None else "-"
    thresholds = ThresholdState(store, global_threshold)
    judge = Judge(cosine_judge(version), thresholds.current)
    if verifier is not None:  # its card only: no model is loaded here
        decision = matcher.learned_decision() if learned_decision else None
        if decision is not None and not decision.fits(
                verifier.sha256, decision.encoder_version, verifier.tuned_from):
            decision = None
        judge = matcher.verifier_judge(verifier, decision)
    learned = Learned(store, max_wrong_rate)
    learned.use(judge)
    bound, learns = learned.bound, recorded_learning_mode(store, learns_by_settings)
    return cache_stats(
        store, thresholds, entries=len(entries),
        nbytes=sum(entry.nbytes for entry in entries),
        stale_entries=sum(1 for entry in entries if entry.encoder_version != version),
        encoder_version=version, encoder_backend=backend,
        embedding_dim=int(newest.embedding.shape[0]) if newest is not None else 0,
        bound=bound, max_wrong_rate=max_wrong_rate, learns_from_answers=learns,
        warmup=Exploration.for_judge(judge.name, explore_rate, warmup=explore_warmup
                                     ).warmup_in_force(learns),
        checked=learned.own_over(bound.threshold))
