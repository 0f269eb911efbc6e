"""The conversations the proxy answered in one cache, kept so that an app's next request
can be recognised (its turns before the question are one of them: the cache's context
rules then apply to the question) and so that feedback on a response id reaches the turn
it names. An app sends its whole history with every request, so each response is its own
conversation; they live in a bounded DiskCache (the least recently stored go first).
"""

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import diskcache
from meancache.client.chat.conversations import Conversation

SIZE_LIMIT = 64 * 1024 * 1024  # bytes of conversations kept per cache


def history_key(turns: Sequence[tuple[str, str]]) -> str:
    """The key of a conversation's (question, answer) turns, as an app sends them back:
    questions as the cache cleaned them, answers without surrounding white space."""
    text = json.dumps([[question.strip(), answer.strip()] for question, answer in turns],
                      ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()


def _turns(conversation: Conversation) -> list[tuple[str, str]]:
    return [(turn.question, turn.answer) for turn in conversation.turns]


class ExchangeStore:
    def __init__(self, directory: Path, size_limit: int = SIZE_LIMIT) -> None:
        self._db = diskcache.Cache(str(directory), eviction_policy="least-recently-stored",
                                   size_limit=size_limit, statistics=False, timeout=30)

    def close(self) -> None:
        self._db.close()

    def save(self, conversation: Conversation) -> None:
        """Keep ``conversation``, findable by its id and by its turns."""
        self._db.set(("conversation", conversation.id), conversation.to_json())
        self._db.set(("history", history_key(_turns(conversation))), conversation.id)

    def load(self, conversation_id: str) -> Conversation | None:
        record = self._db.get(("conversation", conversation_id))
        return None if record is None else Conversation.from_json(record)

    def known(self, turns: Sequence[tuple[str, str]]) -> Conversation | None:
        """The conversation these turns are, if the proxy answered it (its last answer
        may since have been replaced: then it is not this one)."""
        found = self._db.get(("history", history_key(turns)))
        conversation = None if found is None else self.load(str(found))
        if conversation is None or history_key(_turns(conversation)) != history_key(turns):
            return None
        return conversation
