"""The Matcher: one rule decides a hit for the instruction pack's similar match and for the
semantic cache; one normalisation of a question before it is embedded; feedback on a
served match recorded once; and the cache's vector space changed only when it really
changes (an F7 sync that finds nothing new re-embeds nothing)."""

import asyncio
import json
from collections.abc import Callable
from pathlib import Path

import pytest
from meancache.client.cache import CacheSettings, Hit, SemanticCache
from meancache.client.chat.answering import AnswerService
from meancache.client.chat.conversations import Conversation, ConversationStore
from meancache.client.chat.global_model import switch_to_latest
from meancache.client.chat.session import ChatSession
from meancache.client.config import load_settings
from meancache.client.encoder import load_device_encoder
from meancache.client.matching.labels import labelled_pairs
from meancache.client.pack import PackHit, PackStore
from meancache.client.pack.store import PACK_FILE
from meancache.client.upstream_client import UpstreamClient, UpstreamUnavailableError
from meancache.shared.encoder import Encoder, PCAProjection
from meancache.shared.pack import write_pack
from meancache.shared.pairs import Pair

from meancache.cli import main
from tests.support.servers import free_port

CacheFactory = Callable[..., SemanticCache]

FRANCE = "What is the capital of France?"
LONG_STORY = "Tell me a long story about a dragon and a knight. " * 40


def pack_with(directory: Path, instructions: list[str], encoder: Encoder) -> PackStore:
    """A pack of ``instructions`` whose vectors are made (as `meancache ask` makes them)."""
    write_pack(directory / PACK_FILE, [(i, f"pack: {i}") for i in instructions],
               model="builtin:tiny", sigma=4.0)
    packs = PackStore(directory)
    packs.prepare(encoder, wait=True)
    return packs


@pytest.mark.parametrize(("stored", "asked", "settings"), [
    (FRANCE, "What is France's capital?", CacheSettings()),  # a paraphrase
    (FRANCE, "What isn't the capital of France?", CacheSettings()),  # vetoed
    (FRANCE, "What isn't the capital of France?", CacheSettings(verify_hits=False)),
    (FRANCE, "What is France's capital?",
     CacheSettings(global_threshold=0.995, recall_margin=0.0)),  # under tau
    (LONG_STORY + "The dragon wins.", LONG_STORY + "The knight wins.",
     CacheSettings()),  # differs only past the encoder's window
])
def test_the_pack_and_the_cache_decide_a_question_alike(
        make_cache: CacheFactory, encoder: Encoder, tmp_path: Path, stored: str, asked: str,
        settings: CacheSettings) -> None:
    cache = make_cache(settings=settings)
    cache.insert(stored, "cached answer")
    packs = pack_with(tmp_path / "packs", [stored], encoder)
    from_pack = packs.lookup_similar(asked, cache.matcher)
    from_cache = cache.lookup(asked)
    assert isinstance(from_pack, PackHit) == isinstance(from_cache, Hit)
    if isinstance(from_pack, PackHit) and isinstance(from_cache, Hit):
        # the cache stores float16 vectors: a unit-vector dot product moves by <= 2**-11
        assert from_pack.similarity == pytest.approx(from_cache.similarity, abs=2**-11)


def test_a_veto_of_the_best_pack_candidate_is_a_miss(make_cache: CacheFactory,
                                                     encoder: Encoder, tmp_path: Path) -> None:
    """As in the cache with the rule verifier: the look-alike is the nearest instruction,
    the paraphrase under it is never served in its place."""
    asked = "Is Python faster than Java?"
    packs = pack_with(tmp_path / "packs", ["Is Java faster than Python?",
                                           "Does Python run faster than Java?"], encoder)
    rules = make_cache(settings=CacheSettings(verifier="rules")).matcher
    assert not isinstance(packs.lookup_similar(asked, rules), PackHit)


def test_one_normalisation_before_embedding_for_both_sources(
        make_cache: CacheFactory, encoder: Encoder, tmp_path: Path) -> None:
    """"Summarise." and "summarise" are one question: they score alike against
    "summarize" (unnormalised, 0.889 against 0.977)."""
    cache = make_cache(settings=CacheSettings(global_threshold=0.8))
    cache.insert("summarize", "cached answer")
    packs = pack_with(tmp_path / "packs", ["summarize"], encoder)
    spelled = [packs.lookup_similar(q, cache.matcher) for q in ("Summarise.", "summarise")]
    cached = [cache.lookup(q) for q in ("Summarise.", "summarise")]
    assert isinstance(spelled[0], PackHit) and isinstance(spelled[1], PackHit)
    assert spelled[0].similarity == pytest.approx(spelled[1].similarity, abs=1e-6)
    assert isinstance(cached[0], Hit) and isinstance(cached[1], Hit)
    assert cached[0].similarity == pytest.approx(cached[1].similarity, abs=1e-6)


def test_a_rejection_counts_once_when_the_fresh_answer_fails(
        make_cache: CacheFactory, tmp_path: Path) -> None:
    """The rejection is real even if the upstream then fails; pressing ctrl+r again does
    not count it twice."""
    cache = make_cache(settings=CacheSettings(global_threshold=0.3, verify_hits=False))
    wrong = cache.insert("What is the capital of Germany?", "Berlin.")
    down = UpstreamClient(f"http://127.0.0.1:{free_port()}", connect_retries=0)
    answers = AnswerService(cache, down, ConversationStore(tmp_path / "conversations"))
    conversation = Conversation()

    async def run() -> None:
        served = await answers.answer(conversation, FRANCE)
        assert served.answer == "Berlin."
        for _ in range(2):
            with pytest.raises(UpstreamUnavailableError):
                await answers.reject(conversation, 0)

    asyncio.run(run())
    assert conversation.turns[0].answer == "Berlin."  # the turn stays until an answer comes
    assert cache.stats().rejections == 1
    assert cache.store.get(wrong.id).rejections == 1
    assert labelled_pairs(cache.store) == [Pair(FRANCE, "What is the capital of Germany?", 0)]


def test_a_pack_rejection_counts_once_when_the_fresh_answer_fails(
        make_cache: CacheFactory, encoder: Encoder, tmp_path: Path) -> None:
    cache = make_cache()
    packs = pack_with(tmp_path / "packs", [FRANCE], encoder)
    down = UpstreamClient(f"http://127.0.0.1:{free_port()}", connect_retries=0)
    answers = AnswerService(cache, down, ConversationStore(tmp_path / "conversations"),
                            packs=packs)
    conversation = Conversation()

    async def run() -> None:
        served = await answers.answer(conversation, "Which city is the capital of France?")
        assert served.source == "pack" and not served.pack_exact
        for _ in range(2):
            with pytest.raises(UpstreamUnavailableError):
                await answers.reject(conversation, 0)

    asyncio.run(run())
    assert cache.stats().rejections == 1
    assert labelled_pairs(cache.store) == [
        Pair("Which city is the capital of France?", "what is the capital of france", 0)]


# the vector space ------------------------------------------------------------------------
def fitted_session(data_dir: Path, distinct_questions: list[str], tmp_path: Path
                   ) -> ChatSession:
    """A chat session as F7 finds it: the device's encoder, a PCA layer fitted."""
    settings = load_settings()
    cache = SemanticCache(settings.cache_dir, load_device_encoder(settings),
                          CacheSettings(pca_dims=16, pca_min_entries=1000))
    for i, question in enumerate(distinct_questions[:30]):
        cache.insert(question, f"answer {i}")
    cache.fit_pca()
    conversations = ConversationStore(settings.conversations_dir)
    unused = UpstreamClient(f"http://127.0.0.1:{free_port()}", connect_retries=0)
    return ChatSession(settings, cache, AnswerService(cache, unused, conversations),
                       conversations, "test")


def test_a_sync_that_finds_nothing_new_re_embeds_nothing(
        data_dir: Path, distinct_questions: list[str], tmp_path: Path) -> None:
    session = fitted_session(data_dir, distinct_questions, tmp_path)
    cache = session.cache
    assert cache.encoder.pca is not None
    space = cache.encoder.version
    moved: list[tuple[int, int]] = []
    try:
        assert switch_to_latest(session, lambda done, total: moved.append((done, total))) == 0
        assert moved == [] and cache.encoder.version == space  # PCA still attached
        assert {e.encoder_version for e in cache.entries()} == {space}
    finally:
        cache.close()


def test_the_stored_pca_is_put_back_after_a_real_switch(
        make_cache: CacheFactory, encoder: Encoder, pca16: PCAProjection,
        distinct_questions: list[str]) -> None:
    cache = make_cache(settings=CacheSettings(pca_dims=16, pca_min_entries=1000))
    for i, question in enumerate(distinct_questions[:30]):
        cache.insert(question, f"answer {i}")
    fitted = cache.fit_pca()
    assert cache.set_encoder(encoder.with_pca(pca16)) == 30  # another space: all move
    assert cache.set_encoder(encoder) == 30  # back to the model: with the cache's own PCA
    assert cache.encoder.pca is not None and cache.encoder.pca.version == fitted.version
    assert cache.set_encoder(encoder) == 0  # and nothing moves when nothing changed


# `meancache ask` and the pack's embedding ----------------------------------------------------
def test_ask_alone_gets_a_similar_pack_answer_on_every_run(
        data_dir: Path, upstream_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The first run makes the pack's vectors before its lookup (progress on stderr),
    later runs load them: the same question is answered from the pack every time."""
    settings = load_settings()
    write_pack(settings.packs_dir / PACK_FILE, [(FRANCE, "Paris (from the pack).")],
               model="builtin:tiny", sigma=4.0)
    for _ in range(2):
        assert main(["ask", "Which city is the capital of France?", "--upstream",
                     upstream_url, "--json"]) == 0
        reply = json.loads(capsys.readouterr().out)
        assert (reply["source"], reply["answer"]) == ("pack", "Paris (from the pack).")


def test_a_cached_answer_in_an_old_conversation_file_is_rejected_through_the_same_path(
        make_cache: CacheFactory, tmp_path: Path, upstream_url: str) -> None:
    """A file saved before turns recorded their origin still loads, and its cached answer
    is rejected like a fresh one: the entry learns, a negative pair, once."""
    cache = make_cache(settings=CacheSettings(global_threshold=0.3, verify_hits=False))
    wrong = cache.insert("What is the capital of Germany?", "Berlin.")
    served = cache.lookup(FRANCE)
    assert isinstance(served, Hit)
    store = ConversationStore(tmp_path / "conversations")
    (store.directory / "old123.json").write_text(json.dumps({
        "id": "old123", "title": "Old", "created": 1.0, "turns": [
            {"question": FRANCE, "answer": "Berlin.", "source": "cache",
             "similarity": served.similarity, "matched_query": served.matched_query,
             "entry_id": wrong.id, "hit_id": served.hit_id, "created": 2.0}]}))
    conversation = store.load("old123")
    assert conversation.turns[0].origin == served.origin
    answers = AnswerService(cache, UpstreamClient(upstream_url, connect_retries=0), store,
                            max_tokens=8)
    asyncio.run(answers.reject(conversation, 0))
    assert cache.stats().rejections == 1 and cache.store.get(wrong.id).rejections == 1
    assert labelled_pairs(cache.store) == [Pair(FRANCE, "What is the capital of Germany?", 0)]
    assert store.load("old123").turns[0].replaced == "Berlin."
