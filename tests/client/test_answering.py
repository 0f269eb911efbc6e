"""The answer service on a real cache and a real upstream (builtin:tiny on loopback): what
it serves, what it caches, and that every answered or corrected turn is saved."""

import asyncio
import dataclasses
import json
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from meancache.client.cache import CacheSettings, Miss, SemanticCache, Source
from meancache.client.chat.answering import AnswerService
from meancache.client.chat.conversations import Conversation, ConversationStore, Turn
from meancache.client.errors import RejectionError
from meancache.client.matching.labels import labelled_pairs
from meancache.client.matching.origins import UpstreamOrigin
from meancache.client.pack import PackStore
from meancache.client.pack.store import PACK_FILE
from meancache.client.tui.screens.stats import stats_rows
from meancache.client.upstream_client import UpstreamClient, UpstreamUnavailableError
from meancache.shared.pack import write_pack
from meancache.shared.pairs import Pair
from meancache.shared.query import clean_query

from tests.support.servers import echo_upstream, free_port, scripted_upstream

CacheFactory = Callable[..., SemanticCache]

QUESTION = "How do I reverse a list in Python?"
PARAPHRASE = "how can I reverse a python list?"


@pytest.fixture
def store(tmp_path: Path) -> ConversationStore:
    return ConversationStore(tmp_path / "conversations")


def service(make_cache: CacheFactory, store: ConversationStore, url: str,
            threshold: float = 0.5, verify_hits: bool = True) -> AnswerService:
    cache = make_cache(settings=CacheSettings(global_threshold=threshold,
                                              tune_min_per_class=1, verify_hits=verify_hits))
    return AnswerService(cache, UpstreamClient(url, connect_retries=0), store,
                         max_tokens=24)


def test_miss_is_stored_then_served(make_cache: CacheFactory, store: ConversationStore,
                                    upstream_url: str) -> None:
    answers = service(make_cache, store, upstream_url)
    conversation = Conversation()
    streamed: list[str] = []

    async def on_delta(text: str) -> None:
        streamed.append(text)

    async def run() -> None:
        first = await answers.answer(conversation, f"  {QUESTION} ", on_delta)
        assert first.source is Source.UPSTREAM and first.answer.strip()
        assert "".join(streamed) == first.answer
        assert first.entry_id is not None
        assert [e.answer for e in answers.cache.entries()] == [first.answer]
        second = await answers.answer(conversation, PARAPHRASE)
        assert second.source is Source.CACHE and second.answer == first.answer
        assert (second.matched_query, second.entry_id) == (QUESTION, first.entry_id)
        assert second.hit_id is not None and second.similarity is not None

    asyncio.run(run())
    assert len(answers.cache) == 1
    assert [t.question for t in conversation.turns] == [QUESTION, PARAPHRASE]
    assert conversation.title == QUESTION  # the first question names the conversation
    saved = store.load(conversation.id)
    assert saved.title == QUESTION
    assert [(t.source, t.answer) for t in saved.turns] == [
        (t.source, t.answer) for t in conversation.turns]
    assert saved.turns[1].source is Source.CACHE  # the enum survives the JSON file


def test_documents_bypass_the_cache(make_cache: CacheFactory, store: ConversationStore,
                                    upstream_url: str, tmp_path: Path) -> None:
    answers = service(make_cache, store, upstream_url)
    cached = answers.cache.insert(QUESTION, "Use reversed() or list.reverse().")
    document = tmp_path / "notes.txt"
    document.write_text("Lists in Python have a reverse() method.\n")
    conversation = Conversation()

    async def run() -> None:
        await answers.attach(conversation, document)
        for _ in range(2):
            turn = await answers.answer(conversation, QUESTION)
            assert turn.source is Source.UPSTREAM and turn.answer != cached.answer
            assert turn.entry_id is None

    asyncio.run(run())
    assert [e.id for e in answers.cache.entries()] == [cached.id]  # nothing stored
    assert answers.cache.stats().hits == 0
    assert len(store.load(conversation.id).turns) == 2


def test_documents_are_marked_messages_a_meancache_upstream_keeps_as_modules(
        make_cache: CacheFactory, store: ConversationStore, upstream_url: str,
        tmp_path: Path) -> None:
    """The document goes as a system message marked as a module: the next question (after
    another turn of history) reads its states back from the real upstream."""
    answers = service(make_cache, store, upstream_url)
    document = tmp_path / "ferry.txt"
    text = "The ferry leaves the north pier at seven and at noon.\n" * 3
    document.write_text(text)
    conversation = Conversation()

    async def run() -> list[Turn]:
        await answers.attach(conversation, document)
        return [await answers.answer(conversation, q)
                for q in ("When does the ferry leave?", "And on Sundays?")]

    first, second = asyncio.run(run())
    assert conversation.documents[0].chars == len(text)
    assert first.cached_tokens < len(text.encode()) <= second.cached_tokens  # byte-level


def test_documents_reach_a_plain_upstream_as_ordinary_messages(
        make_cache: CacheFactory, store: ConversationStore, tmp_path: Path) -> None:
    received: list[dict[str, object]] = []
    document = tmp_path / "notes.txt"
    document.write_text("Lists in Python have a reverse() method.\n")
    conversation = Conversation()
    with echo_upstream(received) as url:
        answers = service(make_cache, store, url)

        async def run() -> None:
            await answers.attach(conversation, document)
            await answers.answer(conversation, QUESTION)

        asyncio.run(run())
    assert received[-1]["messages"] == [
        {"role": "system", "content": "Answer using the documents."},
        {"role": "system", "content": "notes.txt:\nLists in Python have a reverse() method.\n\n"},
        {"role": "user", "content": QUESTION}]


def test_a_conversation_saved_with_pml_documents_still_loads() -> None:
    saved = Conversation().to_json() | {"documents": [
        {"path": "/tmp/notes.txt", "schema": "chat-1-abc", "tokens": 12}]}
    assert Conversation.from_json(saved).documents[0].path == "/tmp/notes.txt"


def test_reject_replaces_the_turn_and_saves(make_cache: CacheFactory,
                                            store: ConversationStore,
                                            upstream_url: str) -> None:
    # A false hit to reject: verification would veto the swapped name, so it is off.
    answers = service(make_cache, store, upstream_url, threshold=0.3, verify_hits=False)
    wrong = answers.cache.insert("What is the capital of Germany?", "Berlin.")
    conversation = Conversation()

    async def run() -> None:
        served = await answers.answer(conversation, "What is the capital of France?")
        assert served.source is Source.CACHE and served.answer == "Berlin."
        correction = await answers.reject(conversation, 0)
        assert correction.turn.source is Source.UPSTREAM
        assert correction.turn.replaced == "Berlin."
        assert correction.threshold.negatives == 1
        with pytest.raises(RejectionError, match="only an answer served from a cache"):
            await answers.reject(conversation, 0)  # the fresh answer is not rejectable

    asyncio.run(run())
    assert conversation.turns[0].replaced == "Berlin." and len(conversation.turns) == 1
    saved = store.load(conversation.id)
    assert [(t.source, t.answer, t.replaced) for t in saved.turns] == [
        (Source.UPSTREAM, conversation.turns[0].answer, "Berlin.")]
    assert labelled_pairs(answers.cache.store) == [
        Pair("What is the capital of France?", "What is the capital of Germany?", 0)]
    assert answers.cache.stats().rejections == 1
    assert answers.cache.store.get(wrong.id).rejections == 1
    corrected = [e for e in answers.cache.entries() if e.id != wrong.id]
    assert [e.source for e in corrected] == [Source.USER_CORRECTED]


def test_a_cancelled_stream_stores_and_saves_nothing(make_cache: CacheFactory,
                                                     store: ConversationStore,
                                                     upstream_url: str) -> None:
    answers = service(make_cache, store, upstream_url)
    conversation = Conversation()

    async def run() -> None:
        task: asyncio.Task[object] | None = None

        async def on_delta(text: str) -> None:
            assert task is not None
            task.cancel()  # the user pressed "stop" while the answer streamed

        task = asyncio.create_task(answers.answer(conversation, QUESTION, on_delta))
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run())
    assert len(answers.cache) == 0 and conversation.turns == []
    assert store.list() == []


def test_a_failed_upstream_stores_and_saves_nothing(make_cache: CacheFactory,
                                                    store: ConversationStore) -> None:
    answers = service(make_cache, store, f"http://127.0.0.1:{free_port()}")
    conversation = Conversation()
    with pytest.raises(UpstreamUnavailableError):
        asyncio.run(answers.answer(conversation, QUESTION))
    assert len(answers.cache) == 0 and conversation.turns == []
    assert store.list() == []


def test_conversation_files_keep_their_source_strings(store: ConversationStore) -> None:
    """Files written before the Source enum load, and are written back unchanged."""
    old = {"id": "abc123", "title": "Old", "created": 1.0, "turns": [
        {"question": "q1", "answer": "a1", "source": "pack", "similarity": 0.912,
         "matched_query": "m1", "entry_id": "e1", "hit_id": "h1", "created": 2.0},
        {"question": "q2", "answer": "a2", "source": "upstream", "ttft_seconds": 0.25,
         "cached_tokens": 7, "created": 3.0}]}
    (store.directory / "abc123.json").write_text(json.dumps(old))
    conversation = store.load("abc123")
    pack, upstream = conversation.turns
    assert (pack.source, upstream.source) == (Source.PACK, Source.UPSTREAM)
    assert pack.source.from_cache and not upstream.source.from_cache
    assert pack.badge == "pack ~0.91 · matched “m1”"  # a semantic pack match
    assert upstream.badge == "upstream · first token 250 ms · 7 prompt tokens reused"
    assert f"**Answer** ({pack.badge}):" in conversation.to_markdown()
    store.save(conversation)
    saved = json.loads((store.directory / "abc123.json").read_text())
    assert [t["source"] for t in saved["turns"]] == ["pack", "upstream"]


@pytest.fixture(scope="module")
def stub_url() -> Iterator[str]:
    with scripted_upstream() as url:
        yield url


def test_an_empty_answer_is_shown_as_such_never_cached_and_rejectable(
        make_cache: CacheFactory, store: ConversationStore, stub_url: str) -> None:
    answers = service(make_cache, store, f"{stub_url}/empty/v1")
    conversation = Conversation()

    async def run() -> None:
        turn = await answers.answer(conversation, QUESTION)
        assert (turn.source, turn.answer, turn.entry_id) == (Source.UPSTREAM, " \n", None)
        assert turn.shown_answer == "(empty answer; the server stopped: stop)"
        again = await answers.answer(conversation, QUESTION)
        assert again.source is Source.UPSTREAM  # not served from the cache either
        correction = await answers.reject(conversation, 1)
        assert correction.threshold is None  # nothing was cached, so tau stays
        assert correction.turn.replaced == " \n"
        assert "replaced an empty answer" in correction.turn.badge

    asyncio.run(run())
    assert len(answers.cache) == 0 and answers.cache.stats().rejections == 0
    saved = store.load(conversation.id)
    assert [t.finish_reason for t in saved.turns] == ["stop", "stop"]
    assert saved.turns[1].replaced == " \n"


def test_an_answer_cut_at_the_token_limit_says_so_in_its_badge() -> None:
    cut = Turn("List twenty countries.", "France, Germany", UpstreamOrigin("e1"),
               ttft_seconds=0.1, completion_tokens=24, finish_reason="length")
    ended = dataclasses.replace(cut, finish_reason="stop")
    assert cut.badge.endswith("· cut at the 24-token limit (answer_max_tokens)")
    assert "cut at" not in ended.badge


def test_a_declined_near_match_says_so_in_its_badge_and_is_counted_by_reason(
        make_cache: CacheFactory, store: ConversationStore, upstream_url: str) -> None:
    """The verifier refuses a look-alike: the upstream answers, its badge says which near
    match the cache declined and why, and the cache's store counts the decline by reason
    (the stats screen and `meancache cache stats` show it)."""
    answers = service(make_cache, store, upstream_url,
                      threshold=CacheSettings().global_threshold)
    answers.cache.insert("What is the capital of France?", "Paris.")
    asked = "What isn't the capital of France?"
    probe = answers.cache.lookup(asked)  # the decision the answer path will meet
    assert isinstance(probe, Miss) and probe.vetoed and probe.best_similarity is not None
    conversation = Conversation()
    turn = asyncio.run(answers.answer(conversation, asked))
    assert turn.source is Source.UPSTREAM
    note = f"cache declined a near match ({probe.best_similarity:.2f}): {probe.reason}"
    assert turn.badge.startswith(f"upstream · {note} · first token ")
    assert store.load(conversation.id).turns[0].badge == turn.badge  # kept in the file
    stats = answers.cache.stats()
    assert sum(stats.declines.values()) == 2 and len(stats.declines) == 1  # one reason
    [(reason, _)] = stats.declines.items()
    assert probe.reason.startswith(reason) and "(" not in reason  # the kind, not the words
    assert dict(stats_rows(stats, None))["near matches declined"] == f"2 (2 {reason})"


def test_a_question_is_cleaned_once_on_its_way_down(make_cache: CacheFactory,
                                                    store: ConversationStore,
                                                    upstream_url: str, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Every question passes the pack (exact, then similar), the cache (lookup, and on a
    miss the insert with its context) and the upstream, yet ``clean_query`` runs once for
    it: wherever the project holds the function, each call is counted."""
    write_pack(tmp_path / "packs" / PACK_FILE, [("What is Python?", "A language.")],
               model="builtin:tiny", sigma=4.0)
    cache = make_cache(settings=CacheSettings(global_threshold=0.5))
    answers = AnswerService(cache, UpstreamClient(upstream_url, connect_retries=0), store,
                            max_tokens=24, packs=PackStore(tmp_path / "packs"),
                            wait_for_pack=True)
    cleaned: list[object] = []

    def counting(text: str | bytes) -> str:
        cleaned.append(text)
        return clean_query(text)

    holders = [module for name, module in list(sys.modules.items())
               if name.startswith("meancache.") and
               getattr(module, "clean_query", None) is clean_query]
    assert holders  # the patch reaches the module that cleans
    for module in holders:
        monkeypatch.setattr(module, "clean_query", counting)
    asked = [f"  {QUESTION} ", PARAPHRASE, "  What is Python?", "And what is Rust? "]
    conversation = Conversation()

    async def run() -> list[Turn]:
        return [await answers.answer(conversation, question) for question in asked]

    turns = asyncio.run(run())
    assert [turn.source for turn in turns] == [Source.UPSTREAM, Source.CACHE, Source.PACK,
                                               Source.UPSTREAM]
    assert cleaned == asked  # once per question, in the order asked
    assert [turn.question for turn in turns] == [q.strip() for q in asked]
    follow_up = next(e for e in cache.entries() if e.query == asked[3].strip())
    assert follow_up.context_query == asked[2].strip()  # the context was not cleaned again
