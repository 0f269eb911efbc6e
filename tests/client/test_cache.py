"""The persistent semantic cache: hits and misses, persistence, stats, stored fields,
eviction, sharing a directory between instances and processes, and re-embedding."""

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from meancache.client.cache import (
    CacheSettings,
    Context,
    EntryNotFoundError,
    Hit,
    Miss,
    SemanticCache,
    Source,
)
from meancache.client.matching.question import embed_texts
from meancache.shared.encoder import Encoder, PCAProjection
from meancache.shared.threshold import DEFAULT_THRESHOLD

from tests.support.paths import REPO

CacheFactory = Callable[..., SemanticCache]


FRANCE = "What is the capital of France?"
FRANCE_PARAPHRASE = "What is France's capital?"
UNRELATED = [
    "How do I bake sourdough bread at home?",
    "What is the best way to learn to play the guitar?",
    "Why is the sky blue during the day?",
    "How many legs does a spider have?",
    "Which programming language should a beginner learn first?",
]


def hit(result: Hit | Miss) -> Hit:
    """The result, asserted to be a hit."""
    assert isinstance(result, Hit), f"expected a hit, got {result}"
    return result


# hits and misses -------------------------------------------------------------------------
def test_exact_repeat_hits(make_cache: CacheFactory) -> None:
    cache = make_cache()
    entry = cache.insert(FRANCE, "Paris.")
    result = hit(cache.lookup(FRANCE))
    assert result.answer == "Paris."
    assert result.matched_query == FRANCE
    assert result.entry_id == entry.id
    assert result.similarity == pytest.approx(1.0, abs=2e-3)
    assert result.source is Source.UPSTREAM
    assert result.hit_id and not result.truncated
    assert hit(cache.lookup(f"  {FRANCE}\n")).entry_id == entry.id  # stripped like inserts


def test_an_asker_taking_fewer_tokens_gets_only_an_answer_that_fits(
        make_cache: CacheFactory) -> None:
    """A cached answer longer than the asker's token budget is a miss (counted as one),
    never a hit cut short; one that fits is served, and a repeat of the question too."""
    cache = make_cache()
    cache.insert("What is the capital of France?", "Paris.", answer_tokens=3)
    short = cache.lookup("What is the capital of France?", max_answer_tokens=2)
    assert isinstance(short, Miss) and "longer than the 2 tokens" in short.reason
    assert short.vetoed  # a near match declined: the answer's badge says why
    assert (cache.stats().hits, cache.stats().misses) == (0, 1)
    assert hit(cache.lookup("What is the capital of France?", max_answer_tokens=3)).answer \
        == "Paris."
    assert isinstance(cache.lookup("what is the capital of france", max_answer_tokens=2),
                      Miss)


def test_paraphrase_hits(make_cache: CacheFactory, paraphrase_pair: tuple[str, str]) -> None:
    cache = make_cache()
    cache.insert(FRANCE, "Paris.")
    q1, q2 = paraphrase_pair
    cache.insert(q1, "an answer from QQP")
    result = hit(cache.lookup(FRANCE_PARAPHRASE))
    assert result.matched_query == FRANCE
    assert cache.threshold <= result.similarity < 0.999
    result = hit(cache.lookup(q2))
    assert (result.matched_query, result.answer) == (q1, "an answer from QQP")


def test_unrelated_query_misses(make_cache: CacheFactory) -> None:
    cache = make_cache()
    empty = cache.lookup(FRANCE)
    assert isinstance(empty, Miss) and empty.best_similarity is None
    cache.insert(FRANCE, "Paris.")
    result = cache.lookup(UNRELATED[0])
    assert isinstance(result, Miss)
    assert result.query == UNRELATED[0]
    assert result.best_similarity is not None and result.best_similarity < cache.threshold
    assert "similar enough" in result.reason


def test_insert_rejects_an_empty_answer(make_cache: CacheFactory) -> None:
    cache = make_cache()
    with pytest.raises(ValueError, match="answer"):
        cache.insert(FRANCE, "  ")
    assert len(cache) == 0


# persistence -----------------------------------------------------------------------------
def test_entries_survive_reopening(make_cache: CacheFactory, tmp_path: Path) -> None:
    cache = make_cache()
    entry = cache.insert(FRANCE, "Paris.")
    cache.lookup(UNRELATED[0])
    cache.close()
    reopened = make_cache()
    assert len(reopened) == 1
    result = hit(reopened.lookup(FRANCE_PARAPHRASE))
    assert (result.entry_id, result.answer) == (entry.id, "Paris.")
    assert reopened.stats().misses == 1  # counters persist too


def test_delete(make_cache: CacheFactory) -> None:
    cache = make_cache()
    keep = cache.insert(UNRELATED[1], "Practice daily.")
    gone = cache.insert(FRANCE, "Paris.")
    assert cache.delete(gone.id) is True
    assert isinstance(cache.lookup(FRANCE), Miss)
    assert cache.delete(gone.id) is False
    with pytest.raises(EntryNotFoundError):
        cache.store.get(gone.id)
    assert len(cache) == 1
    assert hit(cache.lookup(UNRELATED[1])).entry_id == keep.id


def test_clear(make_cache: CacheFactory) -> None:
    cache = make_cache()
    for question in UNRELATED[:3]:
        cache.insert(question, "answer")
    assert cache.clear() == 3
    assert len(cache) == 0 and cache.entries() == []
    assert isinstance(cache.lookup(UNRELATED[0]), Miss)
    assert cache.stats().entries == 0
    cache.insert(FRANCE, "Paris.")  # still usable
    assert len(make_cache()) == 1


# stats and stored fields -----------------------------------------------------------------
def test_stats_count_hits_misses_and_sizes(make_cache: CacheFactory, encoder: Encoder) -> None:
    cache = make_cache()
    a = cache.insert(FRANCE, "Paris.")
    b = cache.insert(UNRELATED[1], "Practice daily.", query_tokens=7, answer_tokens=100)
    hit(cache.lookup(FRANCE))
    hit(cache.lookup(UNRELATED[1]))
    assert isinstance(cache.lookup(UNRELATED[2]), Miss)
    stats = cache.stats()
    assert (stats.entries, stats.hits, stats.misses, stats.rejections) == (2, 2, 1, 0)
    assert stats.hit_rate == pytest.approx(2 / 3)
    assert stats.tokens_saved == a.query_tokens + a.answer_tokens + 107
    assert stats.bytes == a.nbytes + b.nbytes
    assert stats.embedding_dim == 384
    assert stats.bytes_per_embedding == 384 * 2  # float16
    assert stats.encoder_version == encoder.version
    assert stats.encoder_backend == "onnx"
    assert stats.threshold == stats.global_threshold == DEFAULT_THRESHOLD
    assert stats.local_threshold is None
    assert stats.stale_entries == 0 and stats.evictions == 0
    # Both hits repeat a cached question exactly: they teach nothing (see test_feedback).
    assert stats.labelled_positives == 0 and stats.labelled_negatives == 0


def test_entries_store_every_field(make_cache: CacheFactory, encoder: Encoder) -> None:
    cache = make_cache()
    before = time.time()
    first = cache.insert(FRANCE, "Paris.", context=Context(conversation_id="conv-1", turn=0))
    follow = cache.insert(
        "What famous landmark can you find there?", "The Eiffel Tower.",
        context=Context(conversation_id="conv-1", turn=1, prev_entry_id=first.id,
                        prev_query=FRANCE),
        source=Source.PACK, query_tokens=9, answer_tokens=5,
    )
    after = time.time()
    hit(cache.lookup(FRANCE))
    cache.close()

    stored = {e.id: e for e in make_cache().entries()}  # read back from disk
    a, b = stored[first.id], stored[follow.id]
    assert (a.query, a.answer) == (FRANCE, "Paris.")
    assert a.embedding.dtype == np.float16 and a.embedding.shape == (384,)
    expected = embed_texts(encoder, [FRANCE])[0]  # the question as every match embeds it
    assert float(a.embedding.astype(np.float32) @ expected) == pytest.approx(1.0, abs=2e-3)
    assert a.encoder_version == encoder.version
    assert before <= a.created <= b.created <= after
    assert a.last_hit is not None and a.last_hit >= a.created and a.hits == 1
    assert b.last_hit is None and b.hits == 0 and b.rejections == 0
    assert a.query_tokens == encoder.count_tokens(FRANCE) > 0
    assert a.answer_tokens == encoder.count_tokens("Paris.") > 0
    assert (b.query_tokens, b.answer_tokens) == (9, 5)
    assert (a.conversation_id, a.turn, a.prev_id, a.source) == ("conv-1", 0, None, Source.UPSTREAM)
    assert (b.conversation_id, b.turn, b.prev_id, b.source) == ("conv-1", 1, first.id, Source.PACK)
    assert a.context_query is None and a.context_embedding is None
    assert b.context_query == FRANCE
    assert b.context_embedding is not None and b.context_embedding.dtype == np.float16
    assert float(b.context_embedding.astype(np.float32) @ expected) == pytest.approx(1.0, abs=2e-3)


# eviction --------------------------------------------------------------------------------
def test_max_entries_evicts_least_recently_used(make_cache: CacheFactory) -> None:
    cache = make_cache(settings=CacheSettings(max_entries=3))
    a, b, c = (cache.insert(q, f"answer {i}") for i, q in enumerate(UNRELATED[:3]))
    hit(cache.lookup(a.query))  # a is now more recently used than b and c
    d = cache.insert(UNRELATED[3], "answer 3")
    e = cache.insert(UNRELATED[4], "answer 4")
    assert len(cache) == 3
    assert {x.id for x in cache.entries()} == {a.id, d.id, e.id}
    assert isinstance(cache.lookup(b.query), Miss)
    assert isinstance(cache.lookup(c.query), Miss)
    assert hit(cache.lookup(a.query)).entry_id == a.id
    assert cache.stats().evictions == 2
    cache.close()
    assert {x.id for x in make_cache(settings=CacheSettings(max_entries=3)).entries()} == {
        a.id, d.id, e.id}


def test_max_bytes_evicts_until_within_the_limit(make_cache: CacheFactory) -> None:
    """Each entry takes ~2,000 bytes (a 1,000-character answer, 768 bytes of vector, 200 of
    overhead), so 5,000 bytes hold two of them."""
    cache = make_cache(settings=CacheSettings(max_bytes=5000))
    entries = [cache.insert(q, "x" * 1000) for q in UNRELATED[:4]]
    assert all(1900 < e.nbytes < 2100 for e in entries)
    stats = cache.stats()
    assert stats.entries == 2 and stats.bytes <= 5000
    assert {x.id for x in cache.entries()} == {entries[2].id, entries[3].id}
    assert stats.evictions == 2


# sharing a directory ---------------------------------------------------------------------
def test_two_instances_see_each_others_writes(make_cache: CacheFactory) -> None:
    one, two = make_cache(), make_cache()
    entry = one.insert(FRANCE, "Paris.")
    assert hit(two.lookup(FRANCE_PARAPHRASE)).entry_id == entry.id
    other = two.insert(UNRELATED[0], "Use a starter.")
    assert hit(one.lookup(UNRELATED[0])).entry_id == other.id
    assert len(one) == len(two) == 2
    one.delete(other.id)
    assert isinstance(two.lookup(UNRELATED[0]), Miss)
    assert len(two) == 1


def test_delete_through_another_instance_reports_the_deletion(make_cache: CacheFactory) -> None:
    one, two = make_cache(), make_cache()
    entry = one.insert(FRANCE, "Paris.")
    assert two.delete(entry.id) is True
    assert isinstance(one.lookup(FRANCE), Miss)


INSERT_CHILD = """
import sys
from pathlib import Path
from meancache.client.cache import CacheSettings, SemanticCache
from meancache.shared.encoder import Encoder
encoder = Encoder.load(cache_dir=Path(sys.argv[4]))  # the session's checked export
with SemanticCache(Path(sys.argv[1]), encoder, CacheSettings()) as cache:
    print(cache.insert(sys.argv[2], sys.argv[3]).id)
"""


def test_insert_by_another_process_is_found(make_cache: CacheFactory, tmp_path: Path,
                                            encoder_cache_dir: Path) -> None:
    cache = make_cache()
    cache.insert(UNRELATED[0], "Use a starter.")
    child = subprocess.run(
        [sys.executable, "-c", INSERT_CHILD, str(tmp_path / "cache"), FRANCE, "Paris (child).",
         str(encoder_cache_dir)],
        cwd=REPO, capture_output=True, text=True, timeout=180,
    )
    assert child.returncode == 0, child.stderr[-3000:]
    child_id = child.stdout.strip().splitlines()[-1]
    result = hit(cache.lookup(FRANCE_PARAPHRASE))
    assert (result.entry_id, result.answer) == (child_id, "Paris (child).")
    assert len(cache) == 2


# long input ------------------------------------------------------------------------------
def test_long_queries_are_flagged_truncated(make_cache: CacheFactory, encoder: Encoder) -> None:
    cache = make_cache()
    long_query = "Summarise the history of the Roman Empire in detail. " * 40
    other_long = "List every planet of the solar system with its moons please. " * 40
    assert encoder.count_tokens(long_query) > encoder.max_tokens
    cache.insert(long_query, "A long story.")
    result = hit(cache.lookup(long_query))
    assert result.truncated
    assert cache.lookup(other_long).truncated
    short = cache.lookup(FRANCE)
    assert isinstance(short, Miss) and not short.truncated


# re-embedding ----------------------------------------------------------------------------
def test_set_encoder_re_embeds_every_entry(
    make_cache: CacheFactory, torch_encoder: Encoder, pca16: PCAProjection
) -> None:
    cache = make_cache(enc=torch_encoder)
    stored = [cache.insert(q, f"answer {i}") for i, q in enumerate(UNRELATED)]
    cache.insert("What famous landmark can you find there?", "The Eiffel Tower.",
                 context=Context(prev_query=FRANCE))
    old_version = cache.stats().encoder_version
    calls: list[tuple[int, int]] = []
    new_encoder = torch_encoder.with_pca(pca16)
    assert cache.set_encoder(new_encoder, lambda d, t: calls.append((d, t))) == 6
    assert calls and calls[-1] == (6, 6)
    stats = cache.stats()
    assert stats.encoder_version == new_encoder.version != old_version
    assert (stats.embedding_dim, stats.bytes_per_embedding) == (16, 32)
    assert stats.stale_entries == 0 and stats.entries == 6
    for entry in cache.entries():
        assert entry.encoder_version == new_encoder.version
        assert entry.embedding.shape == (16,)
        if entry.context_query is not None:
            assert entry.context_embedding is not None
            assert entry.context_embedding.shape == (16,)
    for entry in stored:
        assert hit(cache.lookup(entry.query)).entry_id == entry.id


def test_fit_pca_re_embeds_and_survives_reopening(
    make_cache: CacheFactory, torch_encoder: Encoder, distinct_questions: list[str],
    tmp_path: Path,
) -> None:
    settings = CacheSettings(pca_dims=16, pca_min_entries=20)
    cache = make_cache(enc=torch_encoder, settings=settings)
    calls: list[tuple[int, int]] = []
    questions = distinct_questions[:25]
    for i, question in enumerate(questions):
        cache.insert(question, f"answer {i}", progress=lambda d, t: calls.append((d, t)))
    assert calls and calls[-1] == (20, 20)  # the fit came with the 20th entry
    assert all(total == 20 for _, total in calls)
    stats = cache.stats()
    assert stats.embedding_dim == 16 and stats.bytes_per_embedding == 32
    assert stats.encoder_version != torch_encoder.version
    assert stats.entries == 25 and stats.stale_entries == 0
    assert list((tmp_path / "cache" / "pca").glob("*.safetensors"))
    entries = cache.entries()
    assert {e.encoder_version for e in entries} == {stats.encoder_version}
    assert all(e.embedding.shape == (16,) for e in entries)
    assert cache.threshold < 1.0  # otherwise nothing could ever be served again
    for question in questions:
        assert hit(cache.lookup(question)).matched_query == question
    version = stats.encoder_version
    cache.close()

    reopened = make_cache(enc=torch_encoder, settings=settings)
    stats = reopened.stats()
    assert (stats.embedding_dim, stats.encoder_version, stats.stale_entries) == (16, version, 0)
    for question in questions[::6]:
        assert hit(reopened.lookup(question)).matched_query == question


def test_a_pca_layer_fitted_by_one_instance_is_used_by_the_other(
    make_cache: CacheFactory, torch_encoder: Encoder, distinct_questions: list[str]
) -> None:
    """Two processes share a directory; one fits PCA (re-embedding every entry). The other
    must keep serving the stored entries, not treat them all as unreadable stale vectors."""
    settings = CacheSettings(pca_dims=16, pca_min_entries=1000, global_threshold=0.5)
    one = make_cache(enc=torch_encoder, settings=settings)
    two = make_cache(enc=torch_encoder, settings=settings)
    questions = distinct_questions[:20]
    for i, question in enumerate(questions):
        one.insert(question, f"answer {i}")
    assert hit(two.lookup(questions[0])).matched_query == questions[0]
    one.fit_pca()
    assert one.stats().embedding_dim == 16
    for question in questions[:3]:
        assert hit(two.lookup(question)).matched_query == question
    assert two.stats().stale_entries == 0


def test_reopening_under_another_encoder_re_embeds(
    make_cache: CacheFactory, encoder: Encoder, torch_encoder: Encoder, pca16: PCAProjection
) -> None:
    cache = make_cache(enc=torch_encoder)
    cache.set_encoder(torch_encoder.with_pca(pca16))
    cache.insert(FRANCE, "Paris.")
    cache.insert(UNRELATED[0], "Use a starter.")
    cache.close()
    calls: list[tuple[int, int]] = []
    reopened = make_cache(enc=encoder, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (2, 2)
    assert reopened.stats().embedding_dim == 384
    assert {e.encoder_version for e in reopened.entries()} == {encoder.version}
    assert hit(reopened.lookup(FRANCE_PARAPHRASE)).matched_query == FRANCE
