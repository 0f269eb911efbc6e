"""The instruction pack in the answer path: exact matches answered on the device (nothing
sent over the network), a `pack` badge, rejection like a cached answer, and stats."""

import asyncio
import socket
from collections.abc import Callable
from pathlib import Path

from meancache.client.cache import CacheSettings, SemanticCache, Source
from meancache.client.chat.answering import AnswerService
from meancache.client.chat.conversations import Conversation, ConversationStore
from meancache.client.matching.labels import labelled_pairs
from meancache.client.pack import PackStore
from meancache.client.pack.store import PACK_FILE
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.pack import write_pack
from meancache.shared.pairs import Pair

CacheFactory = Callable[..., SemanticCache]
ANSWER = "Python is a programming language."


def pack_store(tmp_path: Path) -> PackStore:
    write_pack(tmp_path / "packs" / PACK_FILE, [("What is Python?", ANSWER)],
               model="builtin:tiny", sigma=4.0)
    return PackStore(tmp_path / "packs")


def test_a_pack_answer_sends_nothing_over_the_network(make_cache: CacheFactory,
                                                      tmp_path: Path) -> None:
    # An "upstream" that accepts no connection: anything sent would wait in its backlog.
    listener = socket.create_server(("127.0.0.1", 0))
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    answers = AnswerService(make_cache(), UpstreamClient(url, connect_retries=0),
                            ConversationStore(tmp_path / "conversations"),
                            packs=pack_store(tmp_path))
    conversation = Conversation()
    turn = asyncio.run(answers.answer(conversation, "  what is PYTHON  "))
    assert (turn.source, turn.answer, turn.matched_query) == (Source.PACK, ANSWER,
                                                              "what is python")
    assert turn.badge.startswith("pack · similarity 1.00 · matched “what is python”")
    with listener:
        try:
            listener.accept()
            contacted = True
        except BlockingIOError:
            contacted = False
    assert not contacted
    assert len(answers.cache) == 0  # a pack answer is not copied into the semantic cache
    assert answers.packs.stats().hits == 1


def test_rejecting_a_pack_answer_requeries_and_teaches_like_a_cached_one(make_cache: CacheFactory,
                                                         tmp_path: Path,
                                                         upstream_url: str) -> None:
    cache = make_cache(settings=CacheSettings(global_threshold=0.8))
    packs = pack_store(tmp_path)
    answers = AnswerService(cache, UpstreamClient(upstream_url, connect_retries=0),
                            ConversationStore(tmp_path / "conversations"), max_tokens=8,
                            packs=packs)
    conversation = Conversation()

    async def run() -> None:
        await answers.answer(conversation, "What is Python?")
        correction = await answers.reject(conversation, 0)
        assert correction.turn.replaced == ANSWER and correction.turn.answer != ANSWER
        # The same feedback path as a cached answer's: a labelled negative pair that tau
        # tuning and federated learning read (tau needs 5 of each kind to move).
        assert not correction.threshold.changed and cache.stats().rejections == 1
        assert labelled_pairs(cache.store) == [Pair("What is Python?", "what is python", 0)]
        again = await answers.answer(conversation, "what is python")
        assert again.source is Source.CACHE  # the corrected answer, not the pack's

    asyncio.run(run())
    stats = packs.stats()
    assert (stats.hits, stats.rejected, stats.entries) == (1, 1, 1)
    reopened = PackStore(tmp_path / "packs")  # hits and rejections survive a restart
    assert reopened.stats().hits == 1 and reopened.lookup("What is Python?") is None
