"""Past chats as the chat app uses them: list, export as Markdown, delete (with the cache
entries a chat created, if asked). Every call reads or writes the disk (deleting entries
takes the cache lock): the app calls them from worker threads."""

from dataclasses import dataclass
from pathlib import Path

from meancache.client.cache import SemanticCache
from meancache.client.chat.conversations import Conversation, ConversationStore
from meancache.client.chat.session import ChatSession
from meancache.client.errors import HistoryError


def created_entries(conversation: Conversation) -> list[str]:
    """The cache entries this chat's own questions created (answers it was served from the
    cache belong to the chats that asked first)."""
    return [t.entry_id for t in conversation.turns
            if t.entry_id and not t.source.from_cache]


@dataclass
class ChatHistory:
    conversations: ConversationStore
    cache: SemanticCache
    exports_dir: Path

    @classmethod
    def of(cls, session: ChatSession) -> "ChatHistory":
        return cls(session.conversations, session.cache, session.settings.data_dir / "exports")

    def list(self) -> list[Conversation]:
        """Every readable chat, newest first."""
        return self.conversations.list()

    def save(self, conversation: Conversation) -> None:
        try:
            self.conversations.save(conversation)
        except OSError as exc:
            raise HistoryError(f"cannot save the chat: {exc}") from exc

    def export(self, conversation: Conversation) -> Path:
        """Write the chat as Markdown in the exports folder; returns the file."""
        path = self.exports_dir / f"chat-{conversation.id}.md"
        try:
            self.exports_dir.mkdir(parents=True, exist_ok=True)
            path.write_text(conversation.to_markdown(), encoding="utf-8")
        except OSError as exc:
            raise HistoryError(f"cannot export the chat to {path}: {exc.strerror}") from exc
        return path

    def delete(self, conversation: Conversation, with_cached_answers: bool) -> int:
        """Delete the chat, and the answers it cached when asked; returns how many of
        those went."""
        try:
            self.conversations.delete(conversation.id)
        except OSError as exc:
            raise HistoryError(f"cannot delete the chat: {exc}") from exc
        if not with_cached_answers:
            return 0
        return sum(self.cache.delete(entry_id) for entry_id in created_entries(conversation))
