"""ChatHistory: the chat app's past chats on a real store and a real cache on disk."""

from pathlib import Path

import pytest
from meancache.client.chat.conversations import Conversation, ConversationStore, Turn
from meancache.client.chat.history import ChatHistory
from meancache.client.errors import ConversationNotFoundError, HistoryError
from meancache.client.matching.origins import CacheOrigin, UpstreamOrigin

from tests.conftest import CacheFactory


def chat_with_entries(history: ChatHistory) -> tuple[Conversation, str]:
    """A chat that created one cache entry and was served another from the cache."""
    own = history.cache.insert("How far is the moon?", "About 384,000 km.").id
    other = history.cache.insert("Why is the sky blue?", "Rayleigh scattering.").id
    conversation = Conversation(turns=[
        Turn("How far is the moon?", "About 384,000 km.", UpstreamOrigin(entry_id=own)),
        Turn("Why's the sky blue?", "Rayleigh scattering.",
             CacheOrigin("hit-1", other, "Why is the sky blue?", 0.95)),
    ])
    history.save(conversation)
    return conversation, other


@pytest.fixture
def history(tmp_path: Path, make_cache: CacheFactory) -> ChatHistory:
    return ChatHistory(ConversationStore(tmp_path / "chats"), make_cache(), tmp_path / "exports")


@pytest.mark.parametrize("with_cached_answers", [True, False])
def test_delete_drops_only_the_entries_the_chat_created(history: ChatHistory,
                                                        with_cached_answers: bool) -> None:
    conversation, served = chat_with_entries(history)
    assert [c.id for c in history.list()] == [conversation.id]
    dropped = history.delete(conversation, with_cached_answers)
    assert history.list() == []
    assert dropped == (1 if with_cached_answers else 0)
    left = {e.id for e in history.cache.entries()}
    assert served in left and len(left) == (1 if with_cached_answers else 2)
    with pytest.raises(ConversationNotFoundError):
        history.delete(conversation, with_cached_answers)


def test_export_writes_markdown_or_says_why_not(history: ChatHistory, tmp_path: Path) -> None:
    conversation, _ = chat_with_entries(history)
    path = history.export(conversation)
    assert path.parent == tmp_path / "exports"
    assert "How far is the moon?" in path.read_text(encoding="utf-8")
    blocked = ChatHistory(history.conversations, history.cache, path)  # a file, not a folder
    with pytest.raises(HistoryError, match="cannot export the chat to .*: "):
        blocked.export(conversation)
