"""Changes of vector space (a new encoder, a PCA fit, entries stored under another encoder)
never block an answer: lookups keep the current space until the new one is complete.

To hold a change half-way, the tests pause the re-embedding function or the PCA fit on an
event: a real encoder cannot be made to stop mid-way on demand.
"""

import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from meancache.client.cache import CacheSettings, Hit, Miss, SemanticCache
from meancache.client.cache import space as space_module
from meancache.client.cache.entry import Entry
from meancache.client.matching.question import embed_texts
from meancache.shared.encoder import Encoder, PCAProjection

CacheFactory = Callable[..., SemanticCache]

FRANCE = "What is the capital of France?"
FRANCE_PARAPHRASE = "What is France's capital?"
QUESTIONS = [
    "How do I bake sourdough bread at home?",
    "What is the best way to learn to play the guitar?",
    "Why is the sky blue during the day?",
    "How many legs does a spider have?",
    "Which programming language should a beginner learn first?",
]


class Pause:
    """Holds a patched function at its first call until ``release``."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.released = threading.Event()

    def wrap(self, real: Callable[..., Any]) -> Callable[..., Any]:
        def paused(*args: Any) -> Any:
            self.started.set()
            assert self.released.wait(60), "the test never released the pause"
            return real(*args)
        return paused

    def release(self) -> None:
        self.released.set()


@pytest.fixture
def paused_embedding(monkeypatch: pytest.MonkeyPatch) -> Iterator[Pause]:
    pause = Pause()
    monkeypatch.setattr(space_module, "_encode_entries",
                        pause.wrap(space_module._encode_entries))
    yield pause
    pause.release()  # never leave a worker thread waiting


def hit(result: Hit | Miss) -> Hit:
    assert isinstance(result, Hit), result
    return result


def entry(cache: SemanticCache, entry_id: str) -> Entry:
    return next(e for e in cache.entries() if e.id == entry_id)


def test_lookups_keep_the_current_space_while_a_new_one_is_built(
    make_cache: CacheFactory, torch_encoder: Encoder, pca16: PCAProjection,
    paused_embedding: Pause,
) -> None:
    cache = make_cache(enc=torch_encoder)
    stored = [cache.insert(q, f"answer {i}") for i, q in enumerate(QUESTIONS)]
    new = torch_encoder.with_pca(pca16)
    switch = threading.Thread(target=cache.set_encoder, args=(new,))
    switch.start()
    assert paused_embedding.started.wait(60)

    # Half-way: answers still come, from the old space.
    assert hit(cache.lookup(stored[0].query)).entry_id == stored[0].id
    assert cache.stats().encoder_version == torch_encoder.version
    late = cache.insert(FRANCE, "Paris.")
    assert cache.delete(stored[1].id)

    paused_embedding.release()
    switch.join(60)
    assert not switch.is_alive()
    stats = cache.stats()
    assert (stats.encoder_version, stats.embedding_dim) == (new.version, 16)
    assert stats.stale_entries == 0 and stats.entries == len(QUESTIONS)
    assert {e.encoder_version for e in cache.entries()} == {new.version}
    assert entry(cache, stored[0].id).hits == 1  # the hit served mid-way was kept
    assert stored[1].id not in {e.id for e in cache.entries()}  # not brought back
    assert hit(cache.lookup(FRANCE)).entry_id == late.id  # arrived mid-way, moved too
    assert hit(cache.lookup(stored[2].query)).entry_id == stored[2].id


def stored_under_pca(make_cache: CacheFactory, torch_encoder: Encoder, pca16: PCAProjection,
                     questions: list[str]) -> None:
    """A cache directory whose entries live in a PCA space the next opener will not use."""
    cache = make_cache(enc=torch_encoder)
    cache.set_encoder(torch_encoder.with_pca(pca16))
    for i, question in enumerate(questions):
        cache.insert(question, f"answer {i}")
    cache.close()


def test_a_background_cache_opens_at_once_and_re_embeds_on_its_own_thread(
    make_cache: CacheFactory, encoder: Encoder, torch_encoder: Encoder, pca16: PCAProjection,
    paused_embedding: Pause,
) -> None:
    stored_under_pca(make_cache, torch_encoder, pca16, [FRANCE, *QUESTIONS])
    cache = make_cache(enc=encoder, background=True)  # returns while the job is paused
    assert paused_embedding.started.wait(60)
    status = cache.background.status()
    assert status is not None and "re-embedding" in status.label
    assert cache.stats().stale_entries == 1 + len(QUESTIONS)
    assert isinstance(cache.lookup(FRANCE_PARAPHRASE), Miss)  # not searchable yet, no error

    paused_embedding.release()
    assert cache.background.wait(60)
    assert cache.background.status() is None and cache.background.last_error is None
    assert cache.stats().stale_entries == 0
    assert hit(cache.lookup(FRANCE_PARAPHRASE)).matched_query == FRANCE


def test_closing_stops_a_background_job_and_the_next_open_resumes_it(
    make_cache: CacheFactory, encoder: Encoder, torch_encoder: Encoder, pca16: PCAProjection,
    distinct_questions: list[str], paused_embedding: Pause, tmp_path: Path,
) -> None:
    questions = distinct_questions[:70]  # two batches of 64
    stored_under_pca(make_cache, torch_encoder, pca16, questions)
    cache = make_cache(enc=encoder, background=True)
    assert paused_embedding.started.wait(60)
    # The batch in hand finishes only once the stop was asked for, however slow this thread.
    threading.Thread(target=lambda: cache.background._stop.wait(60)
                     and paused_embedding.release(), daemon=True).start()
    cache.close()  # asks the job to stop; it finishes the batch in hand, then stops
    assert not cache.background.running

    calls: list[tuple[int, int]] = []
    again = make_cache(enc=encoder, progress=lambda d, t: calls.append((d, t)))
    assert calls[-1] == (len(questions) - 64, len(questions) - 64)  # only the rest
    assert again.stats().stale_entries == 0 and len(again) == len(questions)
    assert {e.encoder_version for e in again.entries()} == {encoder.version}


def test_a_pca_fit_crossing_the_threshold_runs_behind_the_answers(
    make_cache: CacheFactory, encoder: Encoder, distinct_questions: list[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pause = Pause()
    monkeypatch.setattr(PCAProjection, "fit", pause.wrap(PCAProjection.fit))
    cache = make_cache(enc=encoder, settings=CacheSettings(pca_dims=16, pca_min_entries=20),
                       background=True)
    questions = distinct_questions[:20]
    try:
        for i, question in enumerate(questions):
            cache.insert(question, f"answer {i}")  # the 20th returns with the fit paused
        assert pause.started.wait(60)
        assert cache.background.status() is not None
        assert cache.stats().embedding_dim == 384
        assert hit(cache.lookup(questions[3])).matched_query == questions[3]
    finally:
        pause.release()
    assert cache.background.wait(60) and cache.background.last_error is None
    stats = cache.stats()
    assert stats.embedding_dim == 16 and stats.stale_entries == 0
    for question in questions[::5]:
        assert hit(cache.lookup(question)).matched_query == question


def test_a_pca_fit_projects_stored_vectors_as_the_encoder_would_embed_them(
    make_cache: CacheFactory, encoder: Encoder, distinct_questions: list[str],
) -> None:
    """The fit moves entries by projecting their stored full vectors (seconds, not minutes
    of re-embedding); the result must be what the reduced encoder gives for the text."""
    cache = make_cache(enc=encoder, settings=CacheSettings(pca_dims=16, pca_min_entries=1000))
    for i, question in enumerate(distinct_questions[:30]):
        cache.insert(question, f"answer {i}")
    cache.fit_pca()
    entries = cache.entries()
    reembedded = embed_texts(cache.encoder, [e.query for e in entries])  # as matched
    for stored, fresh in zip(entries, reembedded, strict=True):
        assert float(stored.embedding.astype("float32") @ fresh) > 0.995
