"""The answer path: the answer sources in order (client/chat/sources.py: instruction
pack, semantic cache, upstream), and the conversation saved with the new turn; feedback
back to the source that answered. The chat app and `meancache ask` both use it.

Nothing half-written is ever cached or saved: an answer is stored only once the upstream
has sent all of it, so a cancelled or broken stream leaves cache and conversation as
they were.
"""

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Protocol

from meancache.client.cache import SemanticCache, ThresholdChange
from meancache.client.chat.conversations import Conversation, Document, Turn
from meancache.client.chat.documents import read_document
from meancache.client.chat.sources import (
    AnswerSource,
    Asked,
    CacheSource,
    Declined,
    MatchingSource,
    OnDelta,
    PackSource,
    UpstreamSource,
)
from meancache.client.errors import RejectionError
from meancache.client.matching.origins import NOT_REJECTABLE, CacheOrigin, PackOrigin
from meancache.client.matching.question import Query
from meancache.client.pack import PackStore
from meancache.client.upstream_client import DEFAULT_MAX_TOKENS, DEFAULT_TEMPERATURE, UpstreamClient
from meancache.shared.progress import Progress


class SavesConversations(Protocol):
    """Where answered conversations are kept: the chat's ConversationStore, or the proxy's
    bounded store of the exchanges it answered."""

    def save(self, conversation: Conversation) -> None: ...


@dataclass(frozen=True)
class Correction:
    """What rejecting a served answer did."""

    turn: Turn
    threshold: ThresholdChange | None  # None: an empty answer was asked again, tau unchanged


class AnswerService:
    """Asks the sources in order (pack, cache, upstream) and saves the turn; sends "wrong
    answer" back to the source that answered."""

    def __init__(self, cache: SemanticCache, upstream: UpstreamClient,
                 conversations: SavesConversations, max_tokens: int = DEFAULT_MAX_TOKENS,
                 temperature: float = DEFAULT_TEMPERATURE, packs: PackStore | None = None, *,
                 wait_for_pack: bool = False, pack_progress: Progress | None = None,
                 preamble: Sequence[dict[str, str]] = ()) -> None:
        """``wait_for_pack``: make the pack's vectors before returning (a one-shot command,
        with ``pack_progress``) instead of on a background job (the chat). ``preamble``:
        the system messages the upstream is asked after (see ``UpstreamSource``)."""
        self.cache = cache
        self.matcher = cache.matcher
        self.packs = packs  # the instruction pack, asked before the semantic cache
        self.upstream = upstream
        self.conversations = conversations
        self.fresh = UpstreamSource(upstream, cache, max_tokens, temperature, preamble)
        cached = CacheSource(cache)
        self._matching: dict[type, MatchingSource] = {CacheOrigin: cached}
        self.sources: list[AnswerSource] = [cached, self.fresh]
        if packs is not None:
            packs.prepare(cache.encoder, pack_progress, wait=wait_for_pack)
            pack = PackSource(packs, self.matcher)
            self._matching[PackOrigin] = pack
            self.sources.insert(0, pack)

    async def answer(self, conversation: Conversation, question: str | Query,
                     on_delta: OnDelta | None = None, asked_by: str | None = None,
                     max_tokens: int | None = None) -> Turn:
        """Answer ``question`` as the next turn of ``conversation``: appended, and the
        conversation saved (a first question also names it). ``asked_by``: the app that
        asked, recorded with a stored answer; ``max_tokens``: the most answer tokens it
        takes, where fewer than this service's own (``Asked.max_tokens``). The question is
        cleaned here, once, and goes down to every source as that ``Query``."""
        asked = Asked(Query.of(question), conversation, len(conversation.turns), on_delta,
                      asked_by, max_tokens)
        turn, declined = None, None
        for source in self.sources:
            outcome = await source.answer(asked)
            if isinstance(outcome, Declined):
                declined = outcome
            elif outcome is not None:
                turn = outcome
                break
        assert turn is not None  # the upstream always answers or raises
        if declined is not None:
            turn = replace(turn, declined=declined.note)
        conversation.add(turn)
        await asyncio.to_thread(self.conversations.save, conversation)
        return turn

    async def reject(self, conversation: Conversation, turn_index: int,
                     on_delta: OnDelta | None = None, asked_by: str | None = None
                     ) -> Correction:
        """The answer of turn ``turn_index`` was wrong: a served match goes back to the
        source that served it (recorded once, however often this is called for it); an
        empty one (never cached) is simply asked again. Either way a fresh answer from
        the upstream (bypassing the caches) takes the turn's place and the conversation
        is saved. A turn that is not ``rejectable`` raises RejectionError."""
        turn = conversation.turns[turn_index]
        if not turn.rejectable:
            raise RejectionError(NOT_REJECTABLE)
        asked = Asked(Query(turn.question), conversation, turn_index, on_delta, asked_by)
        change = None
        if isinstance(turn.origin, CacheOrigin | PackOrigin):
            source = self._matching.get(type(turn.origin))
            if source is None:
                raise RejectionError("this chat has no instruction pack to take the rejection")
            change = await source.reject(asked, turn.origin)
        fresh = await self.fresh.answer(asked, corrected=change is not None)
        correction = Correction(replace(fresh, replaced=turn.answer), change)
        conversation.turns[turn_index] = correction.turn
        await asyncio.to_thread(self.conversations.save, conversation)
        return correction

    async def attach(self, conversation: Conversation, path: Path) -> Document:
        """Attach ``path`` (read now to check it is usable text): later questions in the
        conversation are sent after it."""
        text = await asyncio.to_thread(read_document, path)
        document = Document(str(path.expanduser().resolve()), len(text))
        conversation.documents.append(document)
        return document
