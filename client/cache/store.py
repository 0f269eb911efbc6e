"""The persistent side of the cache: entries, labelled pairs and settings in DiskCache.

DiskCache keeps everything in one SQLite database (WAL mode), so every write below is a
transaction: a process killed mid-insert leaves the previous state intact, and several
processes may share one store. A ``generation`` counter, bumped by every write, tells a
process cheaply whether someone else changed the store since it last looked.
"""

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import diskcache
from meancache.client.cache.entry import Entry
from meancache.client.errors import (
    CacheAccessError,
    CacheCorruptError,
    CacheVersionError,
    EntryNotFoundError,
)

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
_ENTRY = "entry"
_PAIR = "pair"
_META = "meta"
FORMAT_KEY = (_META, "schema")  # the store's format, SCHEMA_VERSION when it was made
OTHER_DIRECTORY = "or set MEANCACHE_DATA_DIR (or --data-dir) to another directory"


def _today() -> str:
    return time.strftime("%Y-%m-%d")  # local: the user's own days


def is_entry_key(key: object) -> bool:
    """Whether a key of the database holds an entry (others hold pairs, states, counters)."""
    return isinstance(key, tuple) and key[0] == _ENTRY


def check_format(found: object, directory: Path) -> None:
    """Refuse a store whose format record is newer than this meancache (or not a format)."""
    if not isinstance(found, int) or found > SCHEMA_VERSION:
        raise CacheVersionError(
            f"the cache in {directory} has format {found!r}, newer than this meancache "
            f"understands ({SCHEMA_VERSION}); upgrade meancache or point MEANCACHE_DATA_DIR "
            "at another directory")


def _entry_key(entry_id: str) -> tuple[str, str]:
    return (_ENTRY, entry_id)


class EntryStore:
    """Entries, labelled pairs and metadata of one cache directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = Path(directory)
        self._check_directory()
        try:
            self._db = diskcache.Cache(
                str(self.directory), eviction_policy="none", size_limit=2**62,
                cull_limit=0, statistics=False, timeout=30,
            )
            self._check_schema()
        except sqlite3.DatabaseError as exc:
            raise CacheCorruptError(
                f"the cache database in {self.directory} is damaged ({exc}); run "
                "`meancache cache repair` to move it aside and salvage what still reads"
            ) from None
        except PermissionError as exc:
            raise CacheAccessError(f"cannot open the cache in {self.directory}: {exc}; fix its "
                                   f"permissions {OTHER_DIRECTORY}") from None

    def _check_directory(self) -> None:
        path = self.directory
        try:
            if path.exists() and not path.is_dir():
                raise CacheAccessError(f"cache path {path} exists and is not a directory; move it "
                                       f"away {OTHER_DIRECTORY}")
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheAccessError(f"cannot create the cache directory {path}: {exc}; check its "
                                   f"parent's permissions {OTHER_DIRECTORY}") from None
        if not os.access(path, os.R_OK | os.W_OK | os.X_OK):
            raise CacheAccessError(
                f"the cache directory {path} is not readable and writable by this user; fix "
                f"its permissions {OTHER_DIRECTORY}"
            )

    def _check_schema(self) -> None:
        found = self._db.get(FORMAT_KEY)
        if found is None:
            self._db.add(FORMAT_KEY, SCHEMA_VERSION)
            self._db.add((_META, "created"), time.time())
        else:
            check_format(found, self.directory)

    def close(self) -> None:
        self._db.close()

    def restore(self, records: dict[Any, Any]) -> None:
        """Write records read from another store of this format (`cache repair`), in one
        transaction; this store's own format record stays."""
        with self._db.transact():
            for key, value in records.items():
                if key != FORMAT_KEY:
                    self._db.set(key, value)
            self._bump()

    # metadata -----------------------------------------------------------------------
    def get_meta(self, name: str, default: Any = None) -> Any:
        return self._db.get((_META, name), default)

    def set_meta(self, name: str, value: Any) -> None:
        with self._db.transact():
            self._db.set((_META, name), value)
            self._bump()

    def set_state(self, name: str, value: Any) -> None:
        """Metadata derived from the entries (e.g. their semantic patterns): written without a
        generation bump, since no entry or vector changed and nobody needs to reload."""
        self._db.set((_META, name), value)

    def set_states(self, values: dict[str, Any]) -> None:
        """Several ``set_state`` writes in one transaction (what the cache learned and what
        summarises it, written together or not at all)."""
        with self._db.transact():
            for name, value in values.items():
                self._db.set((_META, name), value)

    def states(self, prefix: str) -> dict[str, Any]:
        """{name: value} of every metadata record whose name starts with ``prefix``."""
        return {str(key[1]): self._db.get(key) for key in self._db.iterkeys()
                if isinstance(key, tuple) and key[0] == _META
                and str(key[1]).startswith(prefix)}

    def delete_states(self, prefix: str) -> int:
        """Delete, in one transaction, every metadata record whose name starts with
        ``prefix``; returns how many."""
        keys = [key for key in self._db.iterkeys() if isinstance(key, tuple)
                and key[0] == _META and str(key[1]).startswith(prefix)]
        with self._db.transact():
            for key in keys:
                self._db.delete(key)
        return len(keys)

    def add_to_counter(self, name: str, delta: int = 1) -> int:
        """Add to a running total and to today's share of it, which `meancache cache stats`
        draws over time."""
        with self._db.transact():
            self._db.incr((_META, f"day:{name}:{_today()}"), delta, default=0)
            return int(self._db.incr((_META, "count:" + name), delta, default=0))

    def daily(self, name: str) -> dict[str, int]:
        """{date (YYYY-MM-DD): what the counter gained that day}, oldest first."""
        prefix = f"day:{name}:"
        days = {key[1][len(prefix):]: int(self._db.get(key, 0)) for key in self._db.iterkeys()
                if isinstance(key, tuple) and key[0] == _META and str(key[1]).startswith(prefix)}
        return dict(sorted(days.items()))

    def counter(self, name: str) -> int:
        return int(self._db.get((_META, "count:" + name), 0))

    def counters(self, prefix: str) -> dict[str, int]:
        """{name less ``prefix``: total} of every counter whose name starts with it."""
        start = "count:" + prefix
        return {str(key[1])[len(start):]: int(self._db.get(key, 0))
                for key in self._db.iterkeys()
                if isinstance(key, tuple) and key[0] == _META
                and str(key[1]).startswith(start)}

    @property
    def generation(self) -> int:
        return int(self._db.get((_META, "generation"), 0))

    def _bump(self) -> int:
        return int(self._db.incr((_META, "generation"), 1, default=0))

    # entries ------------------------------------------------------------------------
    def put(self, entry: Entry) -> int:
        """Write (or overwrite) an entry; returns the generation after the write."""
        with self._db.transact():
            self._db.set(_entry_key(entry.id), entry.to_record())
            return self._bump()

    def put_many(self, entries: list[Entry]) -> int:
        with self._db.transact():
            for entry in entries:
                self._db.set(_entry_key(entry.id), entry.to_record())
            return self._bump()

    def touch(self, entry: Entry) -> None:
        """Rewrite usage fields (hits, rejections) without a generation bump: vectors and
        membership are unchanged, so other processes need not reload."""
        self._db.set(_entry_key(entry.id), entry.to_record())

    def record_hit(self, entry: Entry, pair_id: str, pair: dict[str, Any]) -> None:
        """The served entry's new usage and the hit's (weakly positive) pair, in one transaction."""
        with self._db.transact():
            self.touch(entry)
            self.put_pair(pair_id, pair)

    def get(self, entry_id: str) -> Entry:
        record = self._db.get(_entry_key(entry_id))
        if record is None:
            raise EntryNotFoundError(f"no cache entry {entry_id!r} (it may have been evicted or "
                                     "deleted); `meancache cache list` shows the entries")
        return Entry.from_record(record)

    def delete(self, entry_ids: list[str]) -> int:
        with self._db.transact():
            for entry_id in entry_ids:
                self._db.delete(_entry_key(entry_id))
            return self._bump()

    def entries(self) -> Iterator[Entry]:
        """Every readable entry; one that cannot be decoded is logged and skipped, not lost."""
        for key in self._db.iterkeys():
            if not is_entry_key(key):
                continue
            try:
                record = self._db.get(key)
                if record is not None:
                    yield Entry.from_record(record)
            except Exception as exc:  # one damaged record must not hide the others
                log.warning("skipping unreadable cache entry %s: %s", key[1], exc)

    def clear_entries(self) -> int:
        keys = [k for k in self._db.iterkeys() if is_entry_key(k)]
        with self._db.transact():
            for key in keys:
                self._db.delete(key)
            self._bump()
        return len(keys)

    # labelled pairs (feedback) --------------------------------------------------------
    def put_pair(self, pair_id: str, pair: dict[str, Any]) -> None:
        self._db.set((_PAIR, pair_id), pair)

    def get_pair(self, pair_id: str) -> dict[str, Any] | None:
        return self._db.get((_PAIR, pair_id))

    def pairs(self) -> list[dict[str, Any]]:
        keys = [k for k in self._db.iterkeys() if isinstance(k, tuple) and k[0] == _PAIR]
        return [p for p in (self._db.get(k) for k in keys) if p is not None]
