"""The semantic match of pack instructions: embedded in the background with the cache's
own encoder (MiniLM), served at cosine >= tau unless verification vetoes it, counted apart
from exact matches, re-embedded for a new pack or encoder, and rejected like a cached
answer."""

import asyncio
import copy
import socket
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import pytest
from meancache.client.cache import CacheSettings, SemanticCache, Source
from meancache.client.chat.answering import AnswerService
from meancache.client.chat.conversations import Conversation, ConversationStore
from meancache.client.matching.matcher import Matcher, NoMatch
from meancache.client.matching.question import embed_texts
from meancache.client.matching.rules import verify
from meancache.client.pack import PackHit, PackStore
from meancache.client.pack.embeddings import EMBEDDINGS_GLOB, JOB_LABEL, embeddings_path
from meancache.client.pack.store import PACK_FILE
from meancache.client.tui.packs import describe_pack
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.encoder import Encoder, PCAProjection
from meancache.shared.pack import write_pack

CacheFactory = Callable[..., SemanticCache]
TAU = 0.8
INSTRUCTION = "How do I reverse a list in Python?"
PARAPHRASE = "What is the way to reverse a Python list?"
ANSWER = "Use my_list.reverse() in place, or my_list[::-1] for a reversed copy."
ENTRIES = [(INSTRUCTION, ANSWER),
           ("What is the capital of France?", "Paris."),
           ("How many legs does a spider have?", "Eight.")]


def write(directory: Path, entries: list[tuple[str, str]] = ENTRIES) -> None:
    write_pack(directory / PACK_FILE, entries, model="builtin:tiny", sigma=4.0)


def ready_store(directory: Path, encoder: Encoder) -> PackStore:
    """A pack store whose instructions are embedded (the background job waited for)."""
    packs = PackStore(directory)
    packs.prepare(encoder)
    assert packs.embeddings.wait(60)
    assert packs.embeddings.background.last_error is None
    return packs


@pytest.fixture
def matcher(make_cache: CacheFactory, tmp_path: Path) -> Matcher:
    """The decision the answer path uses for the pack: the cache's, at tau = TAU."""
    return make_cache(tmp_path / "cache",
                      settings=CacheSettings(global_threshold=TAU)).matcher


def in_space(matcher: Matcher, encoder: Encoder) -> Matcher:
    """The same decision in another vector space (as after a PCA fit)."""
    moved = copy.copy(matcher)
    moved.encoder = encoder
    return moved


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch, encoder: Encoder) -> Iterator[threading.Event]:
    """Holds the pack's embedding job (only it) until set: a slow device on demand."""
    opened = threading.Event()
    encode = encoder.encode

    def held(texts, *args, **kwargs):  # type: ignore[no-untyped-def]
        if threading.current_thread().name.endswith(JOB_LABEL):
            assert opened.wait(60)
        return encode(texts, *args, **kwargs)

    monkeypatch.setattr(encoder, "encode", held)
    yield opened
    opened.set()


def test_a_paraphrase_is_answered_from_the_pack_sending_nothing(make_cache: CacheFactory,
                                                                encoder: Encoder,
                                                                tmp_path: Path) -> None:
    write(tmp_path / "packs")
    packs = ready_store(tmp_path / "packs", encoder)
    listener = socket.create_server(("127.0.0.1", 0))  # accepts nothing: a sent byte waits
    listener.setblocking(False)
    url = f"http://127.0.0.1:{listener.getsockname()[1]}"
    answers = AnswerService(make_cache(settings=CacheSettings(global_threshold=TAU)),
                            UpstreamClient(url, connect_retries=0),
                            ConversationStore(tmp_path / "conversations"), packs=packs)
    turn = asyncio.run(answers.answer(Conversation(), PARAPHRASE))
    assert (turn.source, turn.answer) == (Source.PACK, ANSWER)
    assert turn.matched_query == "how do i reverse a list in python"
    assert TAU <= (turn.similarity or 0.0) < 1.0 and not turn.pack_exact
    assert turn.badge.startswith(f"pack ~{turn.similarity:.2f} · matched “how do i reverse")
    with listener:
        with pytest.raises(BlockingIOError):
            listener.accept()
    assert len(answers.cache) == 0
    stats = packs.stats()
    assert (stats.hits, stats.semantic_hits, stats.embedding) == (0, 1, "ready")


def test_before_the_embeddings_are_ready_the_lookup_falls_through(
        matcher: Matcher, encoder: Encoder, gate: threading.Event, tmp_path: Path) -> None:
    write(tmp_path)
    packs = PackStore(tmp_path)
    # the first lookup starts the embedding job and does not wait for it
    assert not isinstance(packs.lookup_similar(PARAPHRASE, matcher), PackHit)
    status = packs.embeddings.status()
    assert status is not None and status.label == JOB_LABEL
    assert not isinstance(packs.lookup_similar(PARAPHRASE, matcher), PackHit)  # still held: no wait
    assert packs.stats().embedding.startswith("embedding 0/")
    assert packs.lookup("how do I reverse a list in python") is not None  # exact still works
    gate.set()
    assert packs.embeddings.wait(60)
    found = packs.lookup_similar(PARAPHRASE, matcher)
    assert isinstance(found, PackHit) and found.answer == ANSWER


def test_a_negated_near_miss_is_not_served(matcher: Matcher, encoder: Encoder,
                                           tmp_path: Path) -> None:
    write(tmp_path)
    packs = ready_store(tmp_path, encoder)
    near_miss = "What isn't the capital of France?"
    a, b = embed_texts(encoder, [near_miss, "what is the capital of france"])
    assert float(a @ b) >= TAU  # close enough in embedding space ...
    assert verify(near_miss, "what is the capital of france") is not None  # ... but vetoed
    declined = packs.lookup_similar(near_miss, matcher)
    assert isinstance(declined, NoMatch) and declined.vetoed
    found = packs.lookup_similar("Which city is the capital of France?", matcher)
    assert isinstance(found, PackHit)
    assert packs.stats().semantic_hits == 1


def test_a_near_miss_the_pack_declines_says_so_in_the_badge_and_is_counted(
        make_cache: CacheFactory, encoder: Encoder, tmp_path: Path, upstream_url: str) -> None:
    """The pack's own near miss, declined by the verifier: the upstream answers, and its
    badge and the stats say what the pack declined, as for the cache's."""
    write(tmp_path / "packs")
    packs = ready_store(tmp_path / "packs", encoder)
    cache = make_cache(settings=CacheSettings(global_threshold=TAU))
    answers = AnswerService(cache, UpstreamClient(upstream_url, connect_retries=0),
                            ConversationStore(tmp_path / "conversations"), max_tokens=8,
                            packs=packs)
    near_miss = "What isn't the capital of France?"
    probe = packs.lookup_similar(near_miss, cache.matcher)  # the decision the answer meets
    assert isinstance(probe, NoMatch) and probe.vetoed and probe.best_similarity is not None
    turn = asyncio.run(answers.answer(Conversation(), near_miss))
    assert turn.source is Source.UPSTREAM
    note = f"pack declined a near match ({probe.best_similarity:.2f}): {probe.reason}"
    assert turn.badge.startswith(f"upstream · {note} · first token ")
    assert cache.stats().declines == {probe.veto_kind: 2}  # the probe, then the answer


def test_a_question_past_the_encoder_window_is_not_matched(
        matcher: Matcher, encoder: Encoder, tmp_path: Path) -> None:
    long_story = "Tell me a long story about a dragon and a knight. " * 40
    write(tmp_path, [(long_story + "The dragon wins.", "A story.")])
    packs = ready_store(tmp_path, encoder)
    question = long_story + "The knight wins."  # differs only past the window
    assert encoder.is_truncated(question)
    assert not isinstance(packs.lookup_similar(question, matcher), PackHit)


def test_a_new_pack_or_encoder_version_is_embedded_again(
        matcher: Matcher, encoder: Encoder, tmp_path: Path) -> None:
    write(tmp_path)
    packs = ready_store(tmp_path, encoder)
    [first] = tmp_path.glob(EMBEDDINGS_GLOB)
    assert np.load(first).shape == (len(ENTRIES), encoder.dim)
    assert PackStore(tmp_path).stats().embedding == "stored, loaded on first use"

    # A new encoder version (here a PCA layer, as the cache fits one) is embedded anew.
    pca = PCAProjection.fit(encoder.encode_full([q for q, _ in ENTRIES] * 4), dims=3)
    reduced = encoder.with_pca(pca)
    # The old space's vectors do not fit: the lookup falls through while they are made.
    assert not isinstance(packs.lookup_similar(PARAPHRASE, in_space(matcher, reduced)), PackHit)
    assert packs.embeddings.wait(60)
    [second] = tmp_path.glob(EMBEDDINGS_GLOB)
    assert second != first and np.load(second).shape == (len(ENTRIES), 3)
    assert packs.embeddings.ready is not None
    assert packs.embeddings.ready.encoder_version == reduced.version

    # A new pack (another sha256) too, and its instructions are the ones matched.
    write(tmp_path, [("Why is the sky blue?", "Rayleigh scattering.")])
    packs.reload()
    assert not isinstance(packs.lookup_similar("Why does the sky look blue?", matcher), PackHit)
    assert packs.embeddings.wait(60)
    [third] = tmp_path.glob(EMBEDDINGS_GLOB)
    assert third not in (first, second)
    found = packs.lookup_similar("Why does the sky look blue?", matcher)
    assert isinstance(found, PackHit) and found.answer == "Rayleigh scattering."


def test_stored_embeddings_are_loaded_not_recomputed(
        matcher: Matcher, monkeypatch: pytest.MonkeyPatch, encoder: Encoder,
        tmp_path: Path) -> None:
    write(tmp_path)
    ready_store(tmp_path, encoder)
    calls: list[int] = []
    encode = encoder.encode
    monkeypatch.setattr(encoder, "encode", lambda texts, *a, **k: calls.append(len(texts))
                        or encode(texts, *a, **k))
    reopened = ready_store(tmp_path, encoder)
    assert calls == []
    assert isinstance(reopened.lookup_similar(PARAPHRASE, matcher), PackHit)
    assert calls == [1]  # only the query was embedded


def test_a_damaged_embeddings_file_is_embedded_again(matcher: Matcher, encoder: Encoder,
                                                     tmp_path: Path) -> None:
    write(tmp_path)
    ready_store(tmp_path, encoder)
    [path] = tmp_path.glob(EMBEDDINGS_GLOB)
    path.write_bytes(b"not an array")
    packs = ready_store(tmp_path, encoder)
    assert np.load(path).shape == (len(ENTRIES), encoder.dim)
    assert isinstance(packs.lookup_similar(PARAPHRASE, matcher), PackHit)


def test_stats_count_exact_and_semantic_hits_apart(matcher: Matcher, encoder: Encoder,
                                                   tmp_path: Path) -> None:
    write(tmp_path)
    packs = ready_store(tmp_path, encoder)
    assert packs.lookup("how do i reverse a list in python?") is not None
    assert isinstance(packs.lookup_similar(PARAPHRASE, matcher), PackHit)
    assert isinstance(packs.lookup_similar("How many legs has a spider got?", matcher), PackHit)
    stats = PackStore(tmp_path).stats()  # and they survive a restart
    assert (stats.hits, stats.semantic_hits) == (1, 2)
    line = describe_pack(packs.stats())
    assert line is not None and "1 exact + 2 similar hits" in line and "ready" in line


def test_rejecting_a_semantic_pack_answer_requeries_and_is_not_served_again(
        make_cache: CacheFactory, encoder: Encoder, tmp_path: Path, upstream_url: str) -> None:
    write(tmp_path / "packs")
    packs = ready_store(tmp_path / "packs", encoder)
    cache = make_cache(settings=CacheSettings(global_threshold=TAU))
    answers = AnswerService(cache, UpstreamClient(upstream_url, connect_retries=0),
                            ConversationStore(tmp_path / "conversations"), max_tokens=8,
                            packs=packs)
    conversation = Conversation()

    async def run() -> None:
        first = await answers.answer(conversation, PARAPHRASE)
        assert first.source is Source.PACK and not first.pack_exact
        correction = await answers.reject(conversation, 0)
        assert correction.turn.replaced == ANSWER and correction.turn.answer != ANSWER
        assert correction.threshold is not None and not correction.threshold.changed
        again = await answers.answer(Conversation(), PARAPHRASE)
        assert again.source is Source.CACHE  # the corrected answer, not the pack's
        exact = await answers.answer(Conversation(), INSTRUCTION)
        assert exact.source is Source.PACK and exact.pack_exact  # the instruction still is

    asyncio.run(run())
    reopened = PackStore(tmp_path / "packs")  # the rejection survives a restart
    reopened.prepare(encoder)
    assert reopened.embeddings.wait(60)
    assert not isinstance(reopened.lookup_similar(PARAPHRASE, cache.matcher), PackHit)
    assert reopened.stats().rejected == 1


def test_the_answer_path_embeds_a_question_once(make_cache: CacheFactory, encoder: Encoder,
                                                tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The pack's similar match and the semantic cache share one embedding of the question
    (MPNet spends ~25 ms on each)."""
    write(tmp_path / "packs")
    packs = ready_store(tmp_path / "packs", encoder)
    cache = make_cache(settings=CacheSettings(global_threshold=TAU))
    question = "Why is the sky blue during the day?"  # in the cache, not in the pack
    cache.insert(question, "Rayleigh scattering.")
    asked: list[str] = []
    real = encoder.encode

    def counting(texts: list[str], *args: object, **kwargs: object) -> object:
        asked.extend(texts)
        return real(texts, *args, **kwargs)

    monkeypatch.setattr(cache.encoder, "encode", counting)
    answers = AnswerService(cache, UpstreamClient("http://127.0.0.1:9", connect_retries=0),
                            ConversationStore(tmp_path / "conversations"), packs=packs)
    turn = asyncio.run(answers.answer(Conversation(), "Why is the sky blue during the day time?"))
    assert (turn.source, turn.answer) == (Source.CACHE, "Rayleigh scattering.")
    assert asked == ["why is the sky blue during the day time"]  # normalised, embedded once


def test_vectors_that_cannot_be_kept_still_serve_this_run(matcher: Matcher, encoder: Encoder,
                                                          tmp_path: Path) -> None:
    write(tmp_path)
    packs = PackStore(tmp_path)
    assert packs.pack is not None
    blocked = embeddings_path(tmp_path, packs.pack, encoder.version)
    (blocked / "in-the-way").mkdir(parents=True)  # a directory where the file belongs
    packs.prepare(encoder, wait=True)
    assert isinstance(packs.lookup_similar(PARAPHRASE, matcher), PackHit)
    assert blocked.is_dir()
