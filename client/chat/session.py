"""Everything a chat needs, opened together: cache, upstream (embedded or remote),
answer path and conversation store. Shared by `meancache ask` and the chat app."""

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from client.cache import SemanticCache
from client.chat.answering import AnswerService
from client.chat.conversations import ConversationStore
from client.config import Settings
from client.fl.device import DeviceState
from client.upstream_client import UpstreamClient

if TYPE_CHECKING:
    from upstream.server.serve import BackgroundServer

log = logging.getLogger(__name__)


@dataclass
class ChatSession:
    settings: Settings
    cache: SemanticCache
    answers: AnswerService
    conversations: ConversationStore
    upstream_label: str  # what the screen says about where answers come from
    embedded: "BackgroundServer | None" = None  # in-process upstream when no URL is set

    @classmethod
    def open(cls, settings: Settings, progress: Callable[[int, int], None] | None = None
             ) -> "ChatSession":
        """Load the encoder and cache, and start the embedded upstream if none is set.

        Blocking (seconds on the first run, which exports the encoder to ONNX): call it
        from a worker thread in the app.
        """
        encoder = DeviceState(settings).encoder()
        cache = SemanticCache(settings.cache_dir, encoder, settings.cache_settings(), progress)
        embedded = None
        if settings.upstream_url:
            url, label = settings.upstream_url, f"upstream {settings.upstream_url}"
        else:
            from upstream.server.serve import BackgroundServer

            embedded = BackgroundServer(settings.upstream_model).start()
            url = embedded.url
            kind = "untrained demo model" if embedded.loaded.untrained else "local model"
            label = f"embedded upstream: {embedded.loaded.name} ({kind})"
        upstream = UpstreamClient(url, settings.upstream_api_key)
        answers = AnswerService(cache, upstream, settings.answer_max_tokens,
                                settings.temperature)
        return cls(settings, cache, answers, ConversationStore(settings.conversations_dir),
                   label, embedded)

    async def aclose(self) -> None:
        await self.answers.upstream.aclose()
        if self.embedded is not None:
            self.embedded.stop()
        self.cache.close()
