"""The answer path: instruction pack (exact, then similar), semantic cache, then the
upstream (streamed and stored), and the conversation saved with the new turn. The chat
app and `meancache ask` both use it.

Nothing half-written is ever cached or saved: an answer is stored only once the upstream
has sent all of it, so a cancelled or broken stream leaves cache and conversation as
they were.
"""

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

from meancache.client.cache import Context, Hit, SemanticCache, Source, ThresholdChange
from meancache.client.chat.conversations import (
    Conversation,
    ConversationStore,
    Document,
    Turn,
)
from meancache.client.chat.documents import chat_schema, document_prompt, read_document
from meancache.client.pack import PackHit, PackStore
from meancache.client.upstream_client import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    Completed,
    Delta,
    UpstreamClient,
)
from meancache.shared.query import clean_query

OnDelta = Callable[[str], Awaitable[None]]  # awaited per streamed piece of the answer


@dataclass(frozen=True)
class Correction:
    """What rejecting a cached answer did."""

    turn: Turn
    threshold: ThresholdChange | None  # None: an empty answer was asked again, tau unchanged


class AnswerService:
    def __init__(self, cache: SemanticCache, upstream: UpstreamClient,
                 conversations: ConversationStore, max_tokens: int = DEFAULT_MAX_TOKENS,
                 temperature: float = DEFAULT_TEMPERATURE, packs: PackStore | None = None
                 ) -> None:
        self.cache = cache
        self.packs = packs  # the instruction pack, asked before the semantic cache
        if packs is not None:
            packs.prepare(cache.encoder)  # its semantic match is ready after a background job
        self.upstream = upstream
        self.conversations = conversations
        self.max_tokens = max_tokens
        self.temperature = temperature

    @staticmethod
    def context(conversation: Conversation, before: int | None = None) -> Context:
        """The cache context of the next question (or of turn ``before``)."""
        turns = conversation.turns[:before]
        if not turns:
            return Context(conversation.id, 0)
        last = turns[-1]
        return Context(conversation.id, len(turns), last.entry_id, last.question)

    async def answer(self, conversation: Conversation, question: str,
                     on_delta: OnDelta | None = None) -> Turn:
        """Answer ``question`` as the next turn of ``conversation``: appended, and the
        conversation saved (a first question also names it)."""
        question = clean_query(question)
        turn = await self._answer(conversation, question, on_delta)
        if not conversation.turns:
            conversation.title = question[:60]
        conversation.turns.append(turn)
        await asyncio.to_thread(self.conversations.save, conversation)
        return turn

    async def _answer(self, conversation: Conversation, question: str,
                      on_delta: OnDelta | None) -> Turn:
        # An answer about attached documents depends on them: it is neither served from
        # nor stored in the semantic cache.
        if conversation.documents:
            return await self._ask_upstream(conversation, len(conversation.turns), question,
                                            on_delta, Source.UPSTREAM)
        # The instruction pack first: an exact match of the normalised question, then a
        # similar instruction (cosine >= the cache's tau, not vetoed), all on the device.
        found = None if self.packs is None else await asyncio.to_thread(self._ask_pack,
                                                                        question)
        if found is not None:
            return Turn(question, found.answer, Source.PACK, found.similarity,
                        found.instruction, hit_id=found.hit_id)
        result = await asyncio.to_thread(self.cache.lookup, question,
                                         self.context(conversation))
        if isinstance(result, Hit):
            return Turn(question, result.answer, Source.CACHE, result.similarity,
                        result.matched_query, result.entry_id, result.hit_id,
                        truncated=result.truncated)
        turn = await self._ask_upstream(conversation, len(conversation.turns), question,
                                        on_delta, Source.UPSTREAM)
        return replace(turn, truncated=result.truncated)

    def _ask_pack(self, question: str) -> PackHit | None:
        assert self.packs is not None
        found = self.packs.lookup(question)
        if found is None:
            found = self.packs.lookup_similar(question, self.cache.encoder, self.cache.threshold,
                                              self.cache.embed)
        return found

    async def _ask_upstream(self, conversation: Conversation, turn_index: int, question: str,
                            on_delta: OnDelta | None, source: Source) -> Turn:
        history = conversation.turns[:turn_index]
        messages = Conversation(turns=history).messages()
        if conversation.documents:
            messages.append({"role": "user",
                             "content": document_prompt(conversation.documents, question)})
        else:
            messages.append({"role": "user", "content": question})
        completed: Completed | None = None
        async for event in self.upstream.stream_chat(messages, self.max_tokens,
                                                     self.temperature):
            if isinstance(event, Delta):
                if on_delta is not None:
                    await on_delta(event.text)
            else:
                completed = event
        assert completed is not None  # stream_chat always ends with Completed or raises
        turn = Turn(question, completed.text, Source.UPSTREAM,
                    ttft_seconds=completed.ttft_seconds,
                    cached_tokens=completed.cached_tokens,
                    prompt_tokens=completed.prompt_tokens,
                    completion_tokens=completed.completion_tokens,
                    finish_reason=completed.finish_reason)
        if not conversation.documents and not turn.empty:
            entry = await asyncio.to_thread(
                self.cache.insert, question, completed.text,
                self.context(conversation, turn_index), source,
                completed.prompt_tokens, completed.completion_tokens,
            )
            turn = replace(turn, entry_id=entry.id)
        return turn

    async def reject(self, conversation: Conversation, turn_index: int,
                     on_delta: OnDelta | None = None) -> Correction:
        """The answer of turn ``turn_index`` was wrong: a cached one is recorded and tau
        re-tuned; an empty one (never cached) is simply asked again. Either way a fresh
        answer from the upstream (bypassing the caches) takes the turn's place and the
        conversation is saved."""
        turn = conversation.turns[turn_index]
        change = None
        if turn.source is Source.PACK and self.packs is not None:
            # Only this pack answer is wrong, tau stays: an exact match's answer is never
            # served again, a similar one's never again for this question.
            if turn.pack_exact:
                await asyncio.to_thread(self.packs.reject, turn.matched_query or turn.question)
            else:
                await asyncio.to_thread(self.packs.reject_similar, turn.question,
                                        turn.matched_query or "")
            tau = self.cache.threshold
            change = ThresholdChange(tau, tau, 0, 0, "a pack answer: the threshold is not "
                                     "involved")
        elif turn.source.from_cache and turn.hit_id is not None:
            hit = Hit(turn.question, turn.answer, turn.matched_query or "",
                      turn.similarity or 0.0, turn.entry_id or "", turn.source, turn.hit_id)
            change = await asyncio.to_thread(self.cache.reject, hit)
        elif not turn.empty:
            raise ValueError("only answers served from a cache, or empty ones, can be rejected")
        fresh = await self._ask_upstream(conversation, turn_index, turn.question, on_delta,
                                         Source.USER_CORRECTED if change else Source.UPSTREAM)
        correction = Correction(replace(fresh, replaced=turn.answer), change)
        conversation.turns[turn_index] = correction.turn
        await asyncio.to_thread(self.conversations.save, conversation)
        return correction

    async def attach(self, conversation: Conversation, path: Path) -> Document:
        """Register the conversation's documents plus ``path`` as a schema on the upstream."""
        text = await asyncio.to_thread(read_document, path)
        previous = [await asyncio.to_thread(read_document, Path(d.path))
                    for d in conversation.documents]
        document = Document(str(path.expanduser().resolve()), "", 0)
        trial = replace(conversation, documents=[*conversation.documents, document])
        name, pml = chat_schema(trial, [*previous, text])
        info = await self.upstream.add_schema(pml)
        document = replace(document, schema=name, tokens=int(info.get("cached_tokens", 0)))
        for doc in conversation.documents:
            doc.schema = name
        conversation.documents.append(document)
        return document
