"""Answering one question from the cache: a confirmed alias first, then the nearest
entries in the question's context, the matcher's decision on them, exploration of a
would-be hit, and the served entry recorded. The caller (``SemanticCache.lookup``) holds
the cache's lock and has brought the vector space up to date.
"""

import contextlib
import uuid
from collections.abc import Iterator
from functools import partial

import numpy as np
from meancache.client.cache.entries import CachedEntries
from meancache.client.cache.entry import Context
from meancache.client.cache.learning import Learning
from meancache.client.cache.results import Hit, Miss
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.summary import EXPLORED
from meancache.client.cache.threshold import ThresholdState
from meancache.client.errors import EntryNotFoundError
from meancache.client.learning.awaiting import Awaiting, Pending
from meancache.client.learning.state import Learned
from meancache.client.matching.matcher import NOTHING_CLOSE, Match, Matcher, NoMatch
from meancache.client.matching.question import Candidate, Query, Question
from meancache.shared.query import embedding_text


class Lookup:
    def __init__(self, entries: CachedEntries, matcher: Matcher, thresholds: ThresholdState,
                 settings: CacheSettings, learned: Learned, awaiting: Awaiting) -> None:
        self.entries, self.matcher, self.thresholds = entries, matcher, thresholds
        self.settings, self.learned, self.awaiting = settings, learned, awaiting
        self.store = entries.store
        self.learning = Learning(entries, matcher, settings, self.context_vector)

    def __call__(self, query: Query, context: Context | None,
                 max_answer_tokens: int | None = None) -> Hit | Miss:
        alias = self.learned.alias(query.text)
        if alias is not None:
            with contextlib.suppress(EntryNotFoundError):
                entry = self.store.get(alias)
                return self._serve(query.text, Candidate(entry.id, entry.query, 1.0), False,
                                   max_answer_tokens)
            self.learned.forget_alias(query.text)
        question = self.matcher.question(query)
        found, best = self.entries.index.search(
            question.vector, self.settings.candidates, min_score=self.matcher.floor)
        tau = self.thresholds.current
        decision = self.matcher.decide(
            question, self._candidates(found, self.context_vector(context), tau))
        if isinstance(decision, Match) and (explored := self._explores(question, decision)):
            self.store.add_to_counter("misses")
            self.store.add_to_counter(EXPLORED)
            self.awaiting.wait(question.key, explored)
            return Miss(query.text, f"the cache's match (score {explored.score:.2f}) is checked "
                        f"against a fresh answer ({explored.why})", decision.candidate.similarity,
                        question.truncated, explored=True)
        if isinstance(decision, Match):
            with contextlib.suppress(EntryNotFoundError):  # deleted by another process
                return self._serve(query.text, decision.candidate, question.truncated,
                                   max_answer_tokens)
        self.store.add_to_counter("misses")
        if isinstance(decision, NoMatch) and decision.judged is not None:
            self.awaiting.wait(question.key, Pending(*decision.judged,
                                                     weighed=decision.weighed))
        reason = decision.reason if isinstance(decision, NoMatch) else NOTHING_CLOSE
        if isinstance(decision, NoMatch) and decision.vetoed:
            return Miss(query.text, reason, decision.best_similarity, question.truncated, True)
        if reason == NOTHING_CLOSE and best is not None and best >= tau:
            reason = "similar queries were asked in another context"
        return Miss(query.text, reason, best, question.truncated)

    def _explores(self, question: Question, match: Match) -> Pending | None:
        """The would-be hit ``match`` as an exploration, if it is one (``Awaiting``) where
        the learned bound decides. The very same question (served by identity) is never
        explored."""
        if self.matcher.learned is None or match.score is None \
                or embedding_text(match.candidate.text) == question.key:
            return None
        return self.awaiting.explores(match.candidate.key, match.score, match.weighed)

    def context_vector(self, context: Context | None) -> np.ndarray | None:
        """The previous question's vector (None for a first turn, or without context rules)."""
        if not self.settings.context_aware or context is None or not context.is_follow_up:
            return None
        return self.matcher.embed(Query.of(context.prev_query or "").text)

    def _candidates(self, found: list[tuple[str, float]], context_vector: np.ndarray | None,
                    tau: float) -> Iterator[Candidate]:
        """The entries found in this context, best first, each with its own threshold's
        evidence; each read only when the matcher gets to it. One answer is one candidate:
        an entry whose question is a confirmed alias of another found here (an agreeing
        answer, stored under its own question too) is no rival to it, so the nearer of
        the two stands for both, and a third rewording is not declined as ambiguous
        between two stored questions with one answer."""
        answers: set[str] = set()  # the entries standing for an answer already weighed
        for entry, similarity in self.entries.in_context(found, context_vector, tau):
            answer = self.learned.alias(entry.query) or entry.id
            weighed = answer in answers or entry.id in answers
            answers.update((answer, entry.id))
            if weighed:
                continue
            yield Candidate(entry.id, entry.query, similarity,
                            self.learning.evidence(entry) if self.settings.entry_thresholds
                            else None)

    def _serve(self, query: str, candidate: Candidate, truncated: bool,
               max_answer_tokens: int | None) -> Hit | Miss:
        """The entry's answer served, unless the asker takes fewer tokens than it has (a
        miss: the upstream, asked for no more, gives what the asker would get)."""
        entry = self.store.get(candidate.key)
        if max_answer_tokens is not None and not 0 < entry.answer_tokens <= max_answer_tokens:
            self.store.add_to_counter("misses")
            return Miss(query, f"the cached answer ({entry.answer_tokens} tokens) is longer "
                        f"than the {max_answer_tokens} tokens asked for",
                        candidate.similarity, truncated, vetoed=True)
        entry = self.learning.accepted(entry, query)
        hit = Hit(query, entry.answer, entry.query, candidate.similarity, entry.id,
                  entry.source, uuid.uuid4().hex, truncated)
        self.matcher.feedback.served(query, hit.origin, partial(self.entries.served, entry))
        return hit
