"""`meancache ask "question"`: the chat's answer path without the TUI, for scripts. An exact
instruction-pack hit is answered before anything loads (``answer_exactly``)."""

import asyncio
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.client.chat.conversations import Conversation, ConversationStore, Turn
from meancache.client.config import Settings
from meancache.client.matching.question import Query
from meancache.client.pack import PackStore
from meancache.client.tui.text import printable

if TYPE_CHECKING:  # the session loads the encoder and the upstream: not on the fast path
    from meancache.client.chat.session import ChatSession


def show_turn(turn: Turn, conversation: Conversation, as_json: bool, streamed: bool) -> None:
    """The answer (unless ``streamed`` already wrote it) and its badge, or one JSON line."""
    if as_json:
        print(json.dumps({
            "answer": turn.answer, "source": turn.source, "similarity": turn.similarity,
            "matched_query": turn.matched_query, "conversation": conversation.id,
            "ttft_ms": None if turn.ttft_seconds is None else turn.ttft_seconds * 1000,
            "cached_tokens": turn.cached_tokens, "finish_reason": turn.finish_reason,
        }, ensure_ascii=False))
        return
    if not streamed or turn.empty:
        sys.stdout.write(printable(turn.shown_answer))
    sys.stdout.write(f"\n\n[{printable(turn.badge)}; conversation {conversation.id}]\n")


def answer_exactly(settings: Settings, question: str, conversation_id: str | None,
                   as_json: bool) -> Turn | None:
    """The instruction pack's answer to the very question (normalised), shown and saved as
    the chat would, or None. A hash lookup: no encoder, no upstream, so it answers before
    either loads. (The weak positive pair a served match leaves is skipped: an accepted
    exact repeat teaches nothing, client/matching/labels.py.)"""
    packs = PackStore(settings.packs_dir)
    try:
        if packs.pack is None:
            return None
        conversations = ConversationStore(settings.conversations_dir)
        conversation = (conversations.load(conversation_id) if conversation_id
                        else Conversation())
        if conversation.documents:  # its answers depend on the documents
            return None
        query = Query.of(question)
        found = packs.lookup(query.text)
        if found is None:
            return None
        turn = Turn(query.text, found.answer, found.origin)
        conversation.add(turn)
        conversations.save(conversation)
    finally:
        packs.close()
    show_turn(turn, conversation, as_json, streamed=False)
    return turn


async def ask(session: "ChatSession", question: str, conversation_id: str | None,
              as_json: bool, documents: Sequence[Path] = ()) -> Turn:
    """``documents`` are attached first, as the chat attaches them (those the conversation
    has already are not attached twice); the upstream is sent them marked as modules."""
    conversation = (session.conversations.load(conversation_id) if conversation_id
                    else Conversation())
    attached = {document.path for document in conversation.documents}
    for path in documents:
        if str(path.expanduser().resolve()) not in attached:
            await session.answers.attach(conversation, path)

    async def show(text: str) -> None:
        if not as_json:
            sys.stdout.write(printable(text))
            sys.stdout.flush()

    turn = await session.answers.answer(conversation, question, on_delta=show)
    show_turn(turn, conversation, as_json, streamed=not turn.source.from_cache)
    return turn


def run_ask(session: "ChatSession", question: str, conversation_id: str | None,
            as_json: bool, documents: Sequence[Path] = ()) -> Turn:
    async def main() -> Turn:
        try:
            return await ask(session, question, conversation_id, as_json, documents)
        finally:
            await session.aclose()

    return asyncio.run(main())
