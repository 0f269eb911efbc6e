"""What the cache learns from use of its entries, the only code that changes an entry
after feedback: each entry's own threshold (client/matching/entry_threshold.py: relaxed
by accepted paraphrases, raised above a rejected similarity, re-scored after a change of
vector space) and the context rule (an entry rejected for the same question in another
conversation answers only in its own from then on). The labelled pairs and tau are the
matcher's (client/matching/feedback.py), reached from here once per hit.
"""

import time
from collections.abc import Callable
from dataclasses import replace

import numpy as np
from meancache.client.cache.context import SAME, same_context
from meancache.client.cache.entries import CachedEntries
from meancache.client.cache.entry import Context, Entry
from meancache.client.cache.settings import CacheSettings
from meancache.client.errors import EntryNotFoundError
from meancache.client.matching import entry_threshold
from meancache.client.matching.feedback import ThresholdChange
from meancache.client.matching.matcher import Matcher
from meancache.client.matching.origins import CacheOrigin

ContextVector = Callable[[Context | None], np.ndarray | None]


class Learning:
    def __init__(self, entries: CachedEntries, matcher: Matcher, settings: CacheSettings,
                 context_vector: ContextVector) -> None:
        """``context_vector``: the previous question's vector in the current space."""
        self.entries = entries
        self.matcher = matcher
        self.settings = settings
        self._context_vector = context_vector

    def evidence(self, entry: Entry) -> entry_threshold.Evidence:
        """What the entry's own threshold rests on, its rejected similarity first re-scored
        in the current vector space if it was measured in another."""
        space = self.matcher.encoder.version
        if entry_threshold.needs_rescoring(entry, space):
            rejected = self.matcher.embed(
                entry_threshold.Evidence.of(entry).rejected_query or "")
            entry = entry_threshold.rescored(entry, rejected, space)
            self.entries.store.touch(entry)
        return entry_threshold.Evidence.of(entry)

    def accepted(self, entry: Entry, query: str) -> Entry:
        """``entry`` after serving ``query`` from it (a hit counts as accepted until it is
        rejected)."""
        return replace(entry_threshold.after_accept(entry, query), hits=entry.hits + 1,
                       last_hit=time.time())

    def reject(self, query: str, origin: CacheOrigin, context: Context | None = None
               ) -> ThresholdChange:
        """The user says the answer served for ``query`` (asked in ``context``) from
        ``origin`` was wrong. Once per hit:

        - the same question (similarity >= ``context.SAME``) served in another context: the
          context was wrong, not tau. The entry is bound to its own context, and the hit's
          pair is kept out of what tunes tau and trains FL (it says nothing about where
          paraphrases end); tau stays;
        - otherwise the entry's own threshold rises above the similarity, a negative pair
          is recorded and tau re-tuned (``Feedback.rejected``).

        The caller then fetches a fresh answer, bypassing the cache."""
        feedback = self.matcher.feedback
        with self.entries.lock:
            if feedback.already_rejected(origin):
                return feedback.rejected(query, origin)  # records nothing again
            try:
                entry = self.entries.store.get(origin.entry_id)
            except EntryNotFoundError:
                return feedback.rejected(query, origin)
            entry = replace(entry, rejections=entry.rejections + 1)
            if self.settings.context_aware and origin.similarity >= SAME and not same_context(
                    entry.context_embedding, self._context_vector(context)):
                self.entries.bound(replace(entry, context_bound=True))
                return feedback.rejected(query, origin, in_another_context=True)
            self.entries.store.touch(entry_threshold.after_reject(
                entry, query, origin.similarity, self.matcher.encoder.version))
            return feedback.rejected(query, origin)
