"""The answer sources, asked in order by ``AnswerService``: the instruction pack, the
semantic cache, the upstream. Each takes a question with its context and returns a turn
whose typed origin says what answered, or None; the two that match by meaning decide
through the one ``Matcher`` and take feedback ("wrong answer") on what they served.

The pack and the cache answer nothing about attached documents: such an answer depends on
the documents, so it is neither served from nor stored in a cache.
"""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meancache.client.cache import Context, Hit, Miss, SemanticCache, Source, ThresholdChange
from meancache.client.chat.conversations import Conversation, Turn
from meancache.client.chat.documents import document_messages, read_document
from meancache.client.matching.matcher import Matcher, NoMatch
from meancache.client.matching.origins import CacheOrigin, Matched, PackOrigin, UpstreamOrigin
from meancache.client.matching.question import Query
from meancache.client.pack import PackStore
from meancache.client.upstream_client import Completed, Delta, UpstreamClient
from meancache.shared.pml.marks import MAX_MARKS

OnDelta = Callable[[str], Awaitable[None]]  # awaited per streamed piece of the answer


@dataclass(frozen=True)
class Asked:
    """A question (cleaned once, ``Query.of``) and its context: what every source is
    given."""

    query: Query
    conversation: Conversation
    turn_index: int  # the turn the answer becomes (the turns before it are the history)
    on_delta: OnDelta | None = None
    asked_by: str | None = None  # the app that asked (`meancache proxy`); None: the chat
    # The most answer tokens the asker takes, where fewer than the upstream source asks for
    # (an app's max_tokens, through `meancache proxy`): a cached answer is served only if
    # it is no longer, and the upstream is asked for no more. None: the source's own.
    max_tokens: int | None = None

    @property
    def question(self) -> str:
        return self.query.text

    @property
    def context(self) -> Context:
        """The cache context: the conversation and the turn before this one (whose
        question was cleaned when it was asked)."""
        if self.turn_index == 0:
            return Context(self.conversation.id, 0)
        last = self.conversation.turns[self.turn_index - 1]
        return Context(self.conversation.id, self.turn_index, last.entry_id,
                       Query(last.question))

    @property
    def about_documents(self) -> bool:
        return bool(self.conversation.documents)


@dataclass(frozen=True)
class Declined:
    """A source had a near match and did not serve it: its verifier refused it, or the
    cache checks it against the upstream's fresh answer (``explored``: exploration). The
    answer that follows says so in its badge (else the reason is only in the log)."""

    similarity: float
    reason: str
    source: str  # "cache" or "pack"
    explored: bool = False

    @classmethod
    def of(cls, miss: Miss | NoMatch, source: str = "cache") -> "Declined | None":
        """The decline a miss records, None if nothing was declined."""
        explored = isinstance(miss, Miss) and miss.explored
        if not miss.vetoed and not explored:
            return None
        return cls(miss.best_similarity or 0.0, miss.reason, source, explored)

    @property
    def note(self) -> str:
        if self.explored:
            return f"{self.source} match ({self.similarity:.2f}) checked: {self.reason}"
        return f"{self.source} declined a near match ({self.similarity:.2f}): {self.reason}"


class AnswerSource(Protocol):
    async def answer(self, asked: Asked) -> Turn | Declined | None: ...


class MatchingSource(AnswerSource, Protocol):
    """A source that serves matches: "wrong answer" on one reaches it here."""

    async def reject(self, asked: Asked, origin: Matched) -> ThresholdChange: ...


class PackSource:
    """The instruction pack: the very question, then a similar instruction."""

    def __init__(self, packs: PackStore, matcher: Matcher) -> None:
        self.packs = packs
        self.matcher = matcher

    async def answer(self, asked: Asked) -> Turn | Declined | None:
        if asked.about_documents or asked.max_tokens is not None:  # no count of its length
            return None
        return await asyncio.to_thread(self._lookup, asked.query)

    def _lookup(self, query: Query) -> Turn | Declined | None:
        found = self.packs.lookup(query.text) or self.packs.lookup_similar(query,
                                                                           self.matcher)
        if isinstance(found, NoMatch):
            return Declined.of(found, "pack")
        self.matcher.feedback.served(query.text, found.origin)
        return Turn(query.text, found.answer, found.origin)

    async def reject(self, asked: Asked, origin: Matched) -> ThresholdChange:
        assert isinstance(origin, PackOrigin)
        return await asyncio.to_thread(self._reject, asked.question, origin)

    def _reject(self, question: str, origin: PackOrigin) -> ThresholdChange:
        self.packs.reject(question, origin)
        return self.matcher.feedback.rejected(question, origin)


class CacheSource:
    """The semantic cache."""

    def __init__(self, cache: SemanticCache) -> None:
        self.cache = cache

    async def answer(self, asked: Asked) -> Turn | Declined | None:
        if asked.about_documents:
            return None
        result = await asyncio.to_thread(self.cache.lookup, asked.query, asked.context,
                                         asked.max_tokens)
        if not isinstance(result, Hit):
            return Declined.of(result)
        return Turn(asked.question, result.answer, result.origin, truncated=result.truncated)

    async def reject(self, asked: Asked, origin: Matched) -> ThresholdChange:
        """The context the hit was served in decides what the rejection teaches."""
        assert isinstance(origin, CacheOrigin)
        return await asyncio.to_thread(self.cache.reject, asked.question, origin,
                                       asked.context)


class UpstreamSource:
    """The upstream: always answers (or raises), streamed, and the complete answer stored
    in the cache (a cancelled or broken stream stores nothing). ``preamble``: the system
    messages every question is sent after (the proxy's; the chat sends none), the same for
    every answer this cache stores, and marked as modules for the upstream to keep."""

    def __init__(self, upstream: UpstreamClient, cache: SemanticCache, max_tokens: int,
                 temperature: float, preamble: Sequence[dict[str, str]] = ()) -> None:
        self.upstream = upstream
        self.cache = cache
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.preamble = list(preamble)

    async def _documents(self, asked: Asked) -> list[dict[str, str]]:
        """The conversation's documents as messages, read as they are now."""
        if not asked.about_documents:
            return []
        documents = asked.conversation.documents
        texts = [await asyncio.to_thread(read_document, Path(doc.path)) for doc in documents]
        return document_messages(documents, texts)

    async def answer(self, asked: Asked, corrected: bool = False) -> Turn:
        """``corrected``: the answer replaces a rejected match (stored as such)."""
        fixed = self.preamble + await self._documents(asked)  # marked as modules
        messages = fixed + Conversation(
            turns=asked.conversation.turns[:asked.turn_index]).messages()
        messages.append({"role": "user", "content": asked.question})
        completed: Completed | None = None
        max_tokens = self.max_tokens if asked.max_tokens is None \
            else min(self.max_tokens, asked.max_tokens)
        async for event in self.upstream.stream_chat(messages, max_tokens,
                                                     self.temperature,
                                                     range(min(len(fixed), MAX_MARKS))):
            if isinstance(event, Delta):
                if asked.on_delta is not None:
                    await asked.on_delta(event.text)
            else:
                completed = event
        assert completed is not None  # stream_chat always ends with Completed or raises
        entry_id, truncated = None, False
        if not asked.about_documents:
            truncated = await asyncio.to_thread(self.cache.encoder.is_truncated,
                                                asked.question)
            # a cut answer is partial; one the asker's smaller max_tokens ended is shorter
            # than the answers the cache stores (a later asker may take more)
            shortened = asked.max_tokens is not None and completed.finish_reason == "length"
            if completed.text.strip() and completed.cut is None and not shortened:
                entry = await asyncio.to_thread(
                    self.cache.insert, asked.query, completed.text, asked.context,
                    Source.USER_CORRECTED if corrected else Source.UPSTREAM,
                    completed.prompt_tokens, completed.completion_tokens,
                    asked_by=asked.asked_by,
                )
                entry_id = entry.id
        return Turn(asked.question, completed.text, UpstreamOrigin(entry_id),
                    ttft_seconds=completed.ttft_seconds,
                    cached_tokens=completed.cached_tokens,
                    prompt_tokens=completed.prompt_tokens,
                    completion_tokens=completed.completion_tokens,
                    finish_reason=completed.finish_reason, truncated=truncated,
                    cut=completed.cut)
