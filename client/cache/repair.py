"""Salvaging a damaged cache (`meancache cache repair`): what can still be read moves to a
new store, and nothing is deleted."""

import logging
import shutil
import sqlite3
import time
from pathlib import Path

import diskcache
from meancache.client.cache.entry import Entry
from meancache.client.cache.store import EntryStore, is_entry_key

log = logging.getLogger(__name__)


def repair(directory: Path) -> tuple[Path, int, int]:
    """Move a damaged cache aside and copy every entry that can still be read into a new one.

    Returns (where the old one now lies, entries salvaged, entries lost). Nothing is
    deleted: what could not be read stays in the moved-aside directory.
    """
    directory = Path(directory)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    aside = directory.with_name(f"{directory.name}.broken-{stamp}")
    suffix = 1
    while aside.exists():  # two repairs within one second
        suffix += 1
        aside = directory.with_name(f"{directory.name}.broken-{stamp}-{suffix}")
    shutil.move(str(directory), str(aside))
    salvaged: list[Entry] = []
    lost = 0
    try:
        old = diskcache.Cache(str(aside), eviction_policy="none", size_limit=2**62)
        for key in list(old.iterkeys()):
            if is_entry_key(key):
                try:
                    salvaged.append(Entry.from_record(old[key]))
                except Exception:  # the damaged ones stay in ``aside``
                    lost += 1
        old.close()
    except sqlite3.DatabaseError as exc:
        log.warning("nothing could be salvaged from %s: %s", aside, exc)
    store = EntryStore(directory)
    if salvaged:
        store.put_many(salvaged)
    store.close()
    return aside, len(salvaged), lost
