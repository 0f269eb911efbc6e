"""The semantic cache: embed the query, find the most similar cached queries, serve an
answer when the conversational context agrees and the ``Matcher`` accepts it (tau or the
entry's own threshold, then verification: client/matching/matcher.py).

Its jobs, each in its own module with its own state: the entries and their transactions
(client/cache/entries.py), the vector space with re-embedding and PCA (client/cache/space.py),
answering a question (client/cache/lookup.py), what feedback changes in an entry
(client/cache/learning.py) and what the traffic teaches about where it may answer
(client/learning); this module joins them behind one lock."""

import contextlib
import logging
import random
from functools import partial
from pathlib import Path

from meancache.client.background import BackgroundWork
from meancache.client.cache.entries import CachedEntries
from meancache.client.cache.entry import STORED_DTYPE, Context, Entry
from meancache.client.cache.lookup import Lookup
from meancache.client.cache.policy.cache_policy import CachePolicy, PolicySettings
from meancache.client.cache.results import CacheStats, Hit, Miss
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.space import VectorSpace
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import cache_stats
from meancache.client.cache.threshold import ThresholdState
from meancache.client.errors import EntryNotFoundError
from meancache.client.learning.agreement import agree
from meancache.client.learning.awaiting import Awaiting
from meancache.client.learning.bound import USER, Label
from meancache.client.learning.explore import Exploration
from meancache.client.learning.state import Learned, record_learning_mode
from meancache.client.matching.feedback import ThresholdChange
from meancache.client.matching.matcher import Matcher, Verifier
from meancache.client.matching.origins import CacheOrigin, Source
from meancache.client.matching.question import Query
from meancache.shared.encoder import Encoder, PCAProjection
from meancache.shared.progress import Progress
from meancache.shared.query import embedding_text

log = logging.getLogger(__name__)


class SemanticCache:
    """A persistent, context-aware semantic cache of one user's LLM answers.

    Thread-safe within a process (one lock); several processes may share a directory:
    each notices the others' writes through the store's generation counter.

    A change of vector space (a new encoder, a PCA fit, entries stored under another
    encoder) is computed off the lock: lookups keep using the current space until the new
    one is complete. ``background=True`` (the chat) also moves that work off the calling
    thread, with its progress in ``background.status()``.
    """

    def __init__(
        self,
        directory: Path,
        encoder: Encoder,
        settings: CacheSettings | None = None,
        progress: Progress | None = None,
        *,
        background: bool = False,
        verifier: Verifier | None = None,
        rng: random.Random | None = None,
        learns: bool = True,
    ) -> None:
        """``verifier``: the shipped learned one unless another is given. ``rng``: the
        draws of exploration (``settings.explore_rate``); the caches that face a user (the
        chat, the proxy) are given one, a seeded one makes it repeatable, and record in the
        store whether they learn from answers (`cache stats` reads it). Without one the
        cache never explores. ``learns`` False: it labels nothing from its traffic (the
        static decision that `eval replay --learn` compares with), as with the setting
        ``learn_from_answers`` false; a user's "wrong answer" labels either way."""
        self.settings = settings or CacheSettings()
        self.store = EntryStore(Path(directory))
        self.policy = CachePolicy(self.store, PolicySettings(
            self.settings.eviction_policy, self.settings.pattern_clustering))
        self.thresholds = ThresholdState(self.store, self.settings.global_threshold)
        self.thresholds.persist_default()
        self.matcher = Matcher(encoder, self.thresholds, self.store, self.settings.matching,
                               verifier)
        self.space = VectorSpace(Path(directory), self.store, self.settings, self.matcher,
                                 self.thresholds, background=background)
        self._entries = CachedEntries(self.store, self.settings, self.policy,
                                      lambda: self.matcher.encoder)
        self._lock = self._entries.lock
        self.space.attach(self._entries, progress)
        # What the traffic taught (the bound, aliases) and what awaits a label (client/learning)
        self.learned = Learned(self.store, self.settings.max_wrong_rate)
        self.matcher.learned = self.learned
        self.awaiting = Awaiting(self.learned, partial(
            Exploration.for_judge, rate=self.settings.explore_rate,
            width=self.settings.explore_width,
            until_learned=self.settings.explore_until_learned,
            beyond=self.settings.explore_beyond_rate,
            warmup=self.settings.explore_warmup), rng,
            learns and self.settings.learn_from_answers is not False)
        if rng is not None:  # it faces traffic: `cache stats` reads how it labels it
            record_learning_mode(self.store, self.awaiting.learns)
        self._lookup = Lookup(self._entries, self.matcher, self.thresholds, self.settings,
                              self.learned, self.awaiting)
        self.learning = self._lookup.learning

    def close(self) -> None:
        self.background.stop()
        self.policy.close()
        self.store.close()

    def __enter__(self) -> "SemanticCache":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # the vector space (client/cache/space.py) ----------------------------------------
    @property
    def encoder(self) -> Encoder:
        """The whole pipeline of the current vector space (base model, global weights,
        PCA; ``version`` fingerprints all three). The matcher embeds with it."""
        return self.matcher.encoder

    @property
    def background(self) -> BackgroundWork:
        """The change of vector space running off the calling thread, if any."""
        return self.space.background

    def set_encoder(self, encoder: Encoder, progress: Progress | None = None) -> int:
        return self.space.set_encoder(encoder, progress)

    def reembed(self, progress: Progress | None = None) -> int:
        return self.space.reembed(progress)

    def fit_pca(self, progress: Progress | None = None) -> PCAProjection:
        return self.space.fit_pca(progress)

    # lookup -------------------------------------------------------------------------
    @property
    def threshold(self) -> float:
        """The tau lookups use now (see ``thresholds`` for both values)."""
        return self.thresholds.current

    def lookup(self, query: str | bytes | Query, context: Context | None = None,
               max_answer_tokens: int | None = None) -> Hit | Miss:
        """The cached answer the matcher accepts for ``query`` in ``context``, or a miss
        that says why (client/cache/lookup.py); with ``max_answer_tokens``, only an answer
        of at most that many tokens."""
        query = Query.of(query)
        with self._lock:
            self.space.sync()
            return self._lookup(query, context, max_answer_tokens)

    # insert / delete ----------------------------------------------------------------
    def insert(
        self,
        query: str | bytes | Query,
        answer: str,
        context: Context | None = None,
        source: Source = Source.UPSTREAM,
        query_tokens: int | None = None,
        answer_tokens: int | None = None,
        progress: Progress | None = None,
        asked_by: str | None = None,
    ) -> Entry:
        """Store an answer (``asked_by``: the app that asked, for `cache list`). Token counts
        default to the encoder tokenizer's count. A full cache
        under a SCALM policy stores only queries of mid- and high-rank patterns; the entry is
        returned either way (``len`` and ``entries`` tell whether it was kept)."""
        query = Query.of(query).text
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError("answer is empty")
        context = context or Context()
        with self._lock:
            self.space.sync()
            context_query = Query.of(context.prev_query).text if context.prev_query \
                else None
            entry = Entry(
                query=query, answer=answer,
                embedding=self.matcher.embed(query).astype(STORED_DTYPE),
                encoder_version=self.encoder.version,
                context_query=context_query,
                context_embedding=None if context_query is None
                else self.matcher.embed(context_query).astype(STORED_DTYPE),
                conversation_id=context.conversation_id, turn=context.turn,
                prev_id=context.prev_entry_id, source=source,
                query_tokens=self.encoder.count_tokens(query) if query_tokens is None
                else query_tokens,
                answer_tokens=self.encoder.count_tokens(answer) if answer_tokens is None
                else answer_tokens,
                asked_by=asked_by,
            )
            self.awaiting.answered(embedding_text(query), query, answer, self._cached_answer,
                                   lambda fresh, cached: agree(fresh, cached,
                                                               self.encoder.encode))
            self.store.add_to_counter("tokens_upstream", entry.query_tokens + entry.answer_tokens)
            self.policy.asked(entry, self.threshold)
            if not self.policy.admits(entry, self._entries.is_full_with(entry)):
                log.debug("not admitted: a full cache keeps only mid- and high-rank patterns")
                return entry
            self._entries.put(entry)
        self.space.maybe_fit_pca(progress)
        return entry

    def _cached_answer(self, entry_id: str) -> str | None:
        with contextlib.suppress(EntryNotFoundError):
            return self.store.get(entry_id).answer
        return None

    def reset_learning(self) -> int:
        """Forget what the traffic taught (`meancache cache reset-learning`)."""
        with self._lock:
            self.awaiting.clear()
            return self.learned.reset()

    def delete(self, entry_id: str) -> bool:
        with self._lock:
            self.space.sync()
            return self._entries.delete(entry_id)

    def clear(self) -> int:
        with self._lock:
            return self._entries.clear()

    # feedback (client/cache/learning.py) ----------------------------------------------
    def reject(self, query: str, origin: CacheOrigin, context: Context | None = None
               ) -> ThresholdChange:
        """The user says the answer served for ``query`` from ``origin`` was wrong: see
        ``Learning.reject``. The caller then fetches a fresh answer, bypassing the cache.
        The rejection is also the learned bound's strongest label: a wrong pair at the
        judge's score for the two questions, and no alias for ``query``."""
        already = self.matcher.feedback.already_rejected(origin)
        change = self.learning.reject(query, origin, context)
        if not already:
            self.learned.forget_alias(query)
            self.learned.use(self.matcher.judge)
            score = self.matcher.judge_score(query, origin.matched_query)
            self.learned.learn(Label(score, True, 1.0, origin.entry_id, USER))
        return change

    # inspection ---------------------------------------------------------------------
    def entries(self) -> list[Entry]:
        return sorted(self.store.entries(), key=lambda e: e.created)

    def __len__(self) -> int:
        with self._lock:
            self.space.sync()
            return len(self._entries)

    def stats(self) -> CacheStats:
        with self._lock:
            self.space.sync()
            # the judge's own evidence backs a bound before any lookup names the judge
            self.learned.use(self.matcher.judge)
            bound = None if self.learned.prior is None else self.learned.bound
            return cache_stats(
                self.store, self.thresholds, entries=len(self._entries),
                nbytes=self._entries.nbytes, stale_entries=len(self._entries.stale),
                encoder_version=self.encoder.version, encoder_backend=self.encoder.backend,
                embedding_dim=self.encoder.dim, bound=bound,
                max_wrong_rate=self.settings.max_wrong_rate,
                learns_from_answers=self.awaiting.learns, warmup=self.awaiting.warmup,
                checked=None if bound is None else self.learned.own_over(bound.threshold))
