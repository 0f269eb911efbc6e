""""Wrong answer" from the chat and from `meancache proxy`'s feedback: the last turn goes
back through the answer service, and every way that can fail is a MeanCacheError the
screen shows in one line (an unhandled error in a Textual worker ends the app)."""

from meancache.client.chat.answering import AnswerService, Correction, OnDelta
from meancache.client.chat.conversations import Conversation
from meancache.client.errors import RejectionError
from meancache.client.matching.origins import NOT_REJECTABLE


async def reject_last(answers: AnswerService, conversation: Conversation,
                      on_delta: OnDelta | None = None, asked_by: str | None = None
                      ) -> Correction:
    """Record the last answer as wrong and replace it with a fresh one from the upstream
    (``asked_by``: the app whose answer it was, `meancache proxy`'s feedback). Which
    answers may be rejected is the answer service's to say (``Turn.rejectable``)."""
    if not conversation.turns:
        raise RejectionError(NOT_REJECTABLE)
    try:
        return await answers.reject(conversation, len(conversation.turns) - 1, on_delta,
                                    asked_by)
    except OSError as exc:
        raise RejectionError(f"cannot save the chat: {exc}") from exc
