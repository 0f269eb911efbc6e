"""Salvaging a damaged cache (`meancache cache repair`): every record that can still be
read (entries, and beside them the feedback pairs, the learned labels and bound, the
thresholds, the encoder's space and the counters) moves to a new store, and nothing is
deleted."""

import logging
import shutil
import sqlite3
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import diskcache
from meancache.client.cache.entry import Entry
from meancache.client.cache.store import FORMAT_KEY, EntryStore, check_format, is_entry_key

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Repaired:
    """What a repair did: where the old cache now lies and what came over from it."""

    aside: Path  # the old cache, moved aside whole
    entries: int  # entries salvaged
    records: int  # other records salvaged (pairs, labels, thresholds, counters...)
    lost: int  # records that could not be read (they stay in ``aside``)
    opened: bool  # whether the old database opened at all


def repair(directory: Path) -> Repaired:
    """Move a cache aside and copy every record that can still be read into a new one.
    Nothing is deleted: what could not be read stays in the moved-aside directory. A
    cache of a newer format is refused (CacheVersionError) and left where it is."""
    directory = Path(directory)
    records, lost, opened = _readable_records(directory)
    if FORMAT_KEY in records:  # a newer meancache's cache is not this one's to rewrite
        check_format(records[FORMAT_KEY], directory)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = directory.with_name(f"{directory.name}.before-repair-{stamp}")
    suffix = 1
    while aside.exists():  # two repairs within one second
        suffix += 1
        aside = directory.with_name(f"{directory.name}.before-repair-{stamp}-{suffix}")
    shutil.move(str(directory), str(aside))
    store = EntryStore(directory)
    store.restore(records)
    store.close()
    entries = sum(1 for key in records if is_entry_key(key))
    return Repaired(aside, entries, len(records) - entries, lost, opened)


def _readable_records(directory: Path) -> tuple[dict[Any, Any], int, bool]:
    """{key: value} of every record of the cache in ``directory`` that reads (an entry
    only where it also decodes), the count of those that do not, and whether the
    database opened at all."""
    records: dict[Any, Any] = {}
    lost = 0
    try:
        old = diskcache.Cache(str(directory), eviction_policy="none", size_limit=2**62)
        try:
            for key in list(old.iterkeys()):
                try:
                    value = old[key]
                    if is_entry_key(key):
                        Entry.from_record(value)
                except Exception:  # the damaged ones stay in ``directory``
                    lost += 1
                    continue
                records[key] = value
        finally:
            old.close()
    except sqlite3.DatabaseError as exc:
        log.warning("nothing could be salvaged from %s: %s", directory, exc)
        return {}, lost, False
    return records, lost, True
