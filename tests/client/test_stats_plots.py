"""`meancache cache stats` draws the hit rate per day and the similarity of served hits,
kept against rejected, from the store's daily counters and feedback pairs."""

import logging
from collections.abc import Iterator
from contextlib import closing
from pathlib import Path

import pytest
from meancache.client.cache import store as store_module
from meancache.client.cache.store import EntryStore

from meancache.cli import main


@pytest.fixture
def dirs(tmp_path: Path) -> Iterator[list[str]]:
    """--data-dir and --config-dir of a fresh install; the CLI's log handlers undone."""
    root = logging.getLogger()
    handlers = list(root.handlers)
    yield ["--data-dir", str(tmp_path / "data"), "--config-dir", str(tmp_path / "config")]
    for handler in list(root.handlers):
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)


def on_day(monkeypatch: pytest.MonkeyPatch, day: str) -> None:
    monkeypatch.setattr(store_module, "_today", lambda: day)


def test_counters_keep_each_days_share(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with closing(EntryStore(tmp_path / "cache")) as store:
        on_day(monkeypatch, "2026-11-20")
        store.add_to_counter("hits", 2)
        store.add_to_counter("misses")
        on_day(monkeypatch, "2026-11-22")
        store.add_to_counter("hits")
        assert store.daily("hits") == {"2026-11-20": 2, "2026-11-22": 1}
        assert store.daily("misses") == {"2026-11-20": 1}
        assert store.counter("hits") == 3  # the running total is unchanged by the split


def test_a_cache_without_history_says_so(dirs: list[str],
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert main([*dirs, "cache", "stats"]) == 0
    out = capsys.readouterr().out
    assert "no lookups recorded yet" in out and "none served yet" in out
    assert "no vectors stored yet" in out and "0 dims" not in out
    assert "┤" not in out  # no empty plot frame


def test_stats_draw_the_hit_rate_and_the_similarity_of_kept_and_rejected_hits(
        dirs: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    with closing(EntryStore(tmp_path / "data" / "cache")) as store:
        for day, hits, misses in (("2026-11-20", 1, 3), ("2026-11-21", 3, 1)):
            on_day(monkeypatch, day)
            store.add_to_counter("hits", hits)
            store.add_to_counter("misses", misses)
        for n, (similarity, label) in enumerate(((0.95, 1), (0.99, 1), (0.90, 0))):
            store.put_pair(f"p{n}", {"query": "q", "matched_query": "m", "label": label,
                                     "similarity": similarity, "time": float(n)})
    monkeypatch.undo()
    assert main([*dirs, "cache", "stats"]) == 0
    out = capsys.readouterr().out
    for text in ("Hit rate per day", "hit rate (%)", "11-20", "11-21",
                 "Similarity of served hits", "kept (2)", "rejected as wrong (1)",
                 "cosine similarity to the cached question"):
        assert text in out, text
    assert "no lookups recorded yet" not in out and "\x1b[" not in out  # plain in a pipe
