"""Faults: unusable directories, damaged databases and records, newer formats, invalid
queries, and a writer killed with SIGKILL in the middle of inserting."""

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from meancache.client.cache import (
    CacheAccessError,
    CacheCorruptError,
    CacheVersionError,
    Entry,
    Hit,
    Miss,
    SemanticCache,
    repair,
)
from meancache.shared.errors import InvalidQueryError

from tests.support.paths import REPO

CacheFactory = Callable[..., SemanticCache]

FRANCE = "What is the capital of France?"
GUITAR = "What is the best way to learn to play the guitar?"
GARBAGE = b"this is not an SQLite database \x00\xff" * 200


def hit(result: Hit | Miss) -> Hit:
    """The result, asserted to be a hit."""
    assert isinstance(result, Hit), f"expected a hit, got {result}"
    return result


# directories that cannot be used ---------------------------------------------------------
def test_cache_path_that_is_a_file(make_cache: CacheFactory, tmp_path: Path) -> None:
    path = tmp_path / "cache"
    path.write_text("not a directory")
    with pytest.raises(CacheAccessError) as info:
        make_cache(path)
    assert str(path) in str(info.value)
    assert path.read_text() == "not a directory"  # left alone


def test_cache_path_below_a_file(make_cache: CacheFactory, tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    path = tmp_path / "file" / "cache"
    with pytest.raises(CacheAccessError) as info:
        make_cache(path)
    assert str(path) in str(info.value)


OPEN_AS_USER_CHILD = """
import json, os, sys
from pathlib import Path
from meancache.client.cache import CacheAccessError, SemanticCache
from meancache.shared.encoder import Encoder
encoder = Encoder.load(cache_dir=Path(sys.argv[1]))  # the session's checked export
if os.geteuid() == 0:  # root ignores file modes: become an ordinary user first
    os.setgid(65534)
    os.setuid(65534)
results = {}
for path in sys.argv[2:]:
    try:
        SemanticCache(Path(path), encoder).close()
        results[path] = ["opened", ""]
    except Exception as exc:
        results[path] = [type(exc).__name__, str(exc)]
print(json.dumps(results))
"""


@pytest.fixture
def permission_dirs() -> Iterator[dict[str, Path]]:
    """A mode-000 cache directory and a cache directory below a mode-000 parent, in a base
    that an unprivileged user can traverse (pytest's own tmp dirs are private to root)."""
    base = Path(tempfile.mkdtemp(prefix="meancache-perms-"))
    base.chmod(0o755)
    locked = base / "locked"
    locked.mkdir()
    closed = base / "closed"
    (closed / "cache").mkdir(parents=True)
    locked.chmod(0)
    closed.chmod(0)
    try:
        yield {"locked": locked, "below_closed": closed / "cache"}
    finally:
        locked.chmod(0o755)
        closed.chmod(0o755)
        shutil.rmtree(base)


def test_unreadable_cache_directories(permission_dirs: dict[str, Path],
                                      encoder_cache_dir: Path) -> None:
    """Runs in a child process, as an unprivileged user when the tests run as root."""
    paths = [str(p) for p in permission_dirs.values()]
    child = subprocess.run([sys.executable, "-c", OPEN_AS_USER_CHILD, str(encoder_cache_dir),
                            *paths], cwd=REPO,
                           capture_output=True, text=True, timeout=180)
    assert child.returncode == 0, child.stderr[-3000:]
    results = json.loads(child.stdout.strip().splitlines()[-1])
    for name, path in permission_dirs.items():
        kind, message = results[str(path)]
        assert kind == "CacheAccessError", f"{name}: {kind}: {message}"
        assert str(path) in message


# damaged databases -----------------------------------------------------------------------
def _corrupt(directory: Path) -> None:
    """Overwrite the SQLite database with garbage (and drop its WAL files)."""
    for suffix in ("-wal", "-shm"):
        (directory / f"cache.db{suffix}").unlink(missing_ok=True)
    (directory / "cache.db").write_bytes(GARBAGE)


def test_corrupt_database_says_how_to_repair(make_cache: CacheFactory, tmp_path: Path) -> None:
    cache = make_cache()
    cache.insert(FRANCE, "Paris.")
    cache.close()
    _corrupt(tmp_path / "cache")
    with pytest.raises(CacheCorruptError) as info:
        make_cache()
    assert "meancache cache repair" in str(info.value)
    assert str(tmp_path / "cache") in str(info.value)


def test_repair_moves_a_corrupt_cache_aside(make_cache: CacheFactory, tmp_path: Path) -> None:
    cache = make_cache()
    cache.insert(FRANCE, "Paris.")
    cache.close()
    directory = tmp_path / "cache"
    _corrupt(directory)
    done = repair(directory)
    assert done.aside != directory and done.aside.parent == directory.parent
    assert (done.aside / "cache.db").read_bytes() == GARBAGE  # nothing deleted
    assert (done.entries, done.records, done.opened) == (0, 0, False)
    fresh = make_cache()
    assert len(fresh) == 0
    fresh.insert(FRANCE, "Paris again.")
    assert hit(fresh.lookup(FRANCE)).answer == "Paris again."


def test_repair_salvages_readable_entries(make_cache: CacheFactory, tmp_path: Path) -> None:
    cache = make_cache()
    kept = [cache.insert(q, f"answer {i}") for i, q in enumerate([FRANCE, GUITAR])]
    cache.store._db.set(("entry", "damaged"), b"garbage record")
    cache.close()
    done = repair(tmp_path / "cache")
    assert (done.entries, done.lost, done.opened) == (2, 1, True)
    assert done.aside.is_dir()
    repaired = make_cache()
    assert {e.id for e in repaired.entries()} == {e.id for e in kept}
    assert hit(repaired.lookup(GUITAR)).answer == "answer 1"


def test_repair_keeps_every_readable_record_beside_the_entries(
        make_cache: CacheFactory, tmp_path: Path) -> None:
    """Feedback pairs, the learned labels and bound, thresholds, the encoder's space and
    the counters are the user's too: a repair that kept only the entries lost them."""
    cache = make_cache()
    cache.insert(FRANCE, "Paris.")
    assert isinstance(cache.lookup(FRANCE), Hit)  # a counter
    cache.store.put_pair("feedback", {"q1": FRANCE, "q2": GUITAR, "label": 0})
    cache.store.set_states({"learned:example": [0.93, False]})
    cache.thresholds.set_local(0.91)
    db = cache.store._db
    before = {key: db[key] for key in db.iterkeys()}
    cache.close()
    done = repair(tmp_path / "cache")
    assert (done.entries, done.lost) == (1, 0)
    assert done.records == len(before) - 1
    repaired = make_cache()
    db = repaired.store._db
    after = {key: db[key] for key in db.iterkeys()}
    generation = ("meta", "generation")
    assert {k: v for k, v in after.items() if k != generation} == \
        {k: v for k, v in before.items() if k != generation}
    assert after[generation] > before[generation]  # other processes reload
    assert repaired.threshold == 0.91
    assert hit(repaired.lookup(FRANCE)).answer == "Paris."


def test_repair_leaves_a_newer_meancaches_cache_where_it_is(
        make_cache: CacheFactory, tmp_path: Path) -> None:
    cache = make_cache()
    cache.insert(FRANCE, "Paris.")
    cache.store._db.set(("meta", "schema"), 99)
    cache.close()
    with pytest.raises(CacheVersionError, match="newer than this meancache"):
        repair(tmp_path / "cache")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith("cache")] == ["cache"]


def test_repairs_in_the_same_second_keep_separate_asides(
    make_cache: CacheFactory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(time, "strftime", lambda *args: "20260101-120000")
    directory = tmp_path / "cache"
    make_cache().close()
    first, second = repair(directory).aside, repair(directory).aside
    assert first != second
    assert (first / "cache.db").is_file() and (second / "cache.db").is_file()


def test_newer_schema_is_refused(make_cache: CacheFactory) -> None:
    cache = make_cache()
    cache.insert(FRANCE, "Paris.")
    cache.store._db.set(("meta", "schema"), 999)
    cache.close()
    with pytest.raises(CacheVersionError, match="999"):
        make_cache()


def _garbage(record: dict[str, Any]) -> object:
    return b"\x80garbage bytes"


def _missing_fields(record: dict[str, Any]) -> object:
    return {"id": "damaged", "query": "half a record"}


def _odd_vector_bytes(record: dict[str, Any]) -> object:
    return record | {"id": "damaged", "embedding": b"\x00" * 7}


def _short_vector(record: dict[str, Any]) -> object:
    return record | {"id": "damaged", "embedding": b"\x00\x3c" * 3}  # 3 float16 ones


@pytest.mark.parametrize("damage", [_garbage, _missing_fields, _odd_vector_bytes, _short_vector])
def test_one_damaged_record_does_not_hide_the_others(
    make_cache: CacheFactory, damage: Callable[[dict[str, Any]], object]
) -> None:
    cache = make_cache()
    good = [cache.insert(q, f"answer {i}") for i, q in enumerate([FRANCE, GUITAR])]
    cache.store._db.set(("entry", "damaged"), damage(good[0].to_record()))
    cache.close()
    reopened = make_cache()
    assert {e.id for e in reopened.entries()} >= {e.id for e in good}
    assert hit(reopened.lookup(FRANCE)).entry_id == good[0].id
    assert hit(reopened.lookup(GUITAR)).entry_id == good[1].id
    assert reopened.stats().entries >= 2


# invalid queries -------------------------------------------------------------------------
INVALID = ["", "   \n", b"\xff\xfe not utf-8", b"bad \xff".decode("utf-8", "surrogateescape")]


@pytest.mark.parametrize("query", INVALID)
def test_invalid_queries_are_refused(make_cache: CacheFactory, query: str | bytes) -> None:
    cache = make_cache()
    with pytest.raises(InvalidQueryError):
        cache.insert(query, "an answer")
    with pytest.raises(InvalidQueryError):
        cache.lookup(query)
    assert len(cache) == 0
    assert cache.stats().misses == 0


# SIGKILL during inserts ------------------------------------------------------------------
KILL_CHILD = """
import json, sys
from pathlib import Path
from meancache.client.cache import CacheSettings, SemanticCache
from meancache.shared.encoder import Encoder
questions = json.loads(Path(sys.argv[2]).read_text())
cache = SemanticCache(Path(sys.argv[1]), Encoder.load(cache_dir=Path(sys.argv[3])),
                      CacheSettings(pca_dims=0))
print("ready", flush=True)
for i, question in enumerate(questions):
    entry = cache.insert(question, f"answer {i} " + "x" * 4000)
    print("done", i, entry.id, flush=True)
print("finished", flush=True)
"""


class LineReader:
    """Lines of a child's stdout, read with a deadline (a hung child fails the test)."""

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None
        self.fd = proc.stdout.fileno()
        self.buffer = b""
        self.lines: list[str] = []
        self.eof = False

    def read_until(self, done: Callable[[list[str]], bool], timeout: float) -> None:
        """Read until ``done(lines)`` holds; fail at EOF or after ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while not done(self.lines):
            if self.eof or time.monotonic() > deadline:
                raise AssertionError(f"child stopped early; its output: {self.lines[-5:]}")
            ready, _, _ = select.select([self.fd], [], [], 0.5)
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                self.eof = not chunk
                *complete, self.buffer = (self.buffer + chunk).split(b"\n")
                self.lines += [line.decode() for line in complete]

    def drain(self, timeout: float) -> None:
        """Read what the (dead) child wrote before it died."""
        self.read_until(lambda _: self.eof, timeout)


def test_sigkill_during_inserts_loses_nothing_reported(
    make_cache: CacheFactory, tmp_path: Path, distinct_questions: list[str],
    encoder_cache_dir: Path
) -> None:
    directory = tmp_path / "cache"
    first = make_cache(directory)
    before = first.insert(FRANCE, "Paris.")
    first.close()
    questions = distinct_questions[:300]
    (tmp_path / "questions.json").write_text(json.dumps(questions))
    with (tmp_path / "child.err").open("wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-c", KILL_CHILD, str(directory), str(tmp_path / "questions.json"),
             str(encoder_cache_dir)],
            cwd=REPO, stdout=subprocess.PIPE, stderr=err,
        )
        try:
            reader = LineReader(proc)
            reader.read_until(lambda lines: "ready" in lines, timeout=180)
            reader.read_until(lambda lines: sum(x.startswith("done") for x in lines) >= 20,
                              timeout=120)
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            reader.drain(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == -signal.SIGKILL
    assert "finished" not in reader.lines, "the child finished before it was killed"
    reported = [line.split() for line in reader.lines if line.startswith("done")]

    cache = make_cache(directory)  # opens without error after the kill
    stored = {e.id: e for e in cache.entries()}
    assert before.id in stored
    for _, i, entry_id in reported:
        entry = stored[entry_id]
        assert entry.query == questions[int(i)]
        assert entry.answer.startswith(f"answer {i} ")
    assert len(reported) <= len(stored) - 1 <= len(reported) + 1  # at most one unreported
    assert len(cache) == len(stored)
    for _, i, entry_id in reported[::5]:
        assert hit(cache.lookup(questions[int(i)])).entry_id == entry_id
    added = cache.insert("A question asked after the crash?", "Still writable.")
    assert hit(cache.lookup(added.query)).entry_id == added.id


def test_entry_records_round_trip(make_cache: CacheFactory) -> None:
    cache = make_cache()
    entry = cache.insert(FRANCE, "Paris.")
    again = Entry.from_record(entry.to_record())
    assert again.to_record() == entry.to_record()
