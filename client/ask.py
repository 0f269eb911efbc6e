"""`meancache ask "question"`: the chat's answer path without the TUI, for scripts."""

import asyncio
import json
import sys

from meancache.client.chat.conversations import Conversation, Turn
from meancache.client.chat.session import ChatSession
from meancache.client.tui.text import printable


async def ask(session: ChatSession, question: str, conversation_id: str | None,
              as_json: bool) -> Turn:
    conversation = (session.conversations.load(conversation_id) if conversation_id
                    else Conversation())

    async def show(text: str) -> None:
        if not as_json:
            sys.stdout.write(printable(text))
            sys.stdout.flush()

    turn = await session.answers.answer(conversation, question, on_delta=show)
    if as_json:
        print(json.dumps({
            "answer": turn.answer, "source": turn.source, "similarity": turn.similarity,
            "matched_query": turn.matched_query, "conversation": conversation.id,
            "ttft_ms": None if turn.ttft_seconds is None else turn.ttft_seconds * 1000,
            "cached_tokens": turn.cached_tokens, "finish_reason": turn.finish_reason,
        }, ensure_ascii=False))
    else:
        if turn.source.from_cache or turn.empty:  # not streamed, or nothing to see
            sys.stdout.write(printable(turn.shown_answer))
        sys.stdout.write(f"\n\n[{printable(turn.badge)}; conversation {conversation.id}]\n")
    return turn


def run_ask(session: ChatSession, question: str, conversation_id: str | None,
            as_json: bool) -> Turn:
    async def main() -> Turn:
        try:
            return await ask(session, question, conversation_id, as_json)
        finally:
            await session.aclose()

    return asyncio.run(main())
