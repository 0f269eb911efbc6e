""""Wrong answer" from the chat: the last turn, if a cache answered it or it is empty,
goes back through the answer service, and every way that can fail is a MeanCacheError the
screen shows in one line (an unhandled error in a Textual worker ends the app)."""

from meancache.client.chat.answering import AnswerService, Correction, OnDelta
from meancache.client.chat.conversations import Conversation
from meancache.client.errors import RejectionError


def can_reject(conversation: Conversation) -> bool:
    """Only a cached answer (a false hit) or an empty one is worth asking again."""
    turns = conversation.turns
    return bool(turns) and (turns[-1].source.from_cache or turns[-1].empty)


async def reject_last(answers: AnswerService, conversation: Conversation,
                      on_delta: OnDelta | None = None, asked_by: str | None = None
                      ) -> Correction:
    """Record the last answer as wrong and replace it with a fresh one from the upstream
    (``asked_by``: the app whose answer it was, `meancache proxy`'s feedback)."""
    if not can_reject(conversation):
        raise RejectionError("only an answer served from a cache, or an empty one, can be "
                             "marked wrong")
    try:
        return await answers.reject(conversation, len(conversation.turns) - 1, on_delta,
                                    asked_by)
    except ValueError as exc:
        raise RejectionError(str(exc)) from exc
    except OSError as exc:
        raise RejectionError(f"cannot save the chat: {exc}") from exc
