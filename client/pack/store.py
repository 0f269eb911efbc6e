"""The device's instruction pack: loaded once, looked up in O(1) before the semantic
cache, with its hit count and the answers the user rejected kept beside it.

Lookups never touch the network: the pack is a local file, read whole into a dict.
"""

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meancache.shared.errors import PackError
from meancache.shared.files import fsync_path
from meancache.shared.pack import Pack, normalise_instruction, read_pack

log = logging.getLogger(__name__)

PACK_FILE = "current.mcpack"
STATE_FILE = "state.json"


@dataclass(frozen=True)
class PackHit:
    instruction: str  # the normalised instruction that matched
    answer: str
    pack_id: str

    @property
    def hit_id(self) -> str:
        """What a rejection of this answer refers to."""
        return f"pack:{self.pack_id}"


@dataclass(frozen=True)
class PackStats:
    pack_id: str | None  # None: no pack downloaded yet
    created: str | None
    model: str | None
    entries: int
    size_bytes: int
    hits: int
    rejected: int


class PackStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / PACK_FILE
        self._lock = threading.Lock()
        self._pack: Pack | None = None
        self._hits = 0
        self._rejected: set[str] = set()
        self.reload()

    def reload(self) -> Pack | None:
        """(Re)read the pack in use, e.g. after a download swapped a new one in. An
        unreadable file leaves the device without a pack, never with a wrong one."""
        pack = None
        if self.path.exists():
            try:
                pack = read_pack(self.path)
            except PackError as exc:
                log.warning("the instruction pack is not used: %s", exc)
        state = self._read_state(pack)
        with self._lock:
            self._pack = pack
            self._hits = state.get("hits", 0)
            self._rejected = set(state.get("rejected", []))
        return pack

    @property
    def pack(self) -> Pack | None:
        return self._pack

    def lookup(self, query: str) -> PackHit | None:
        """The pack's answer to ``query`` normalised, unless the user rejected it."""
        pack = self._pack
        found = None if pack is None else pack.lookup(query)
        if found is None or found[0] in self._rejected:
            return None
        with self._lock:
            self._hits += 1
            self._write_state(durable=False)
        return PackHit(found[0], found[1], pack.manifest.pack_id)

    def reject(self, instruction: str) -> None:
        """Never serve this instruction's answer from the current pack again."""
        with self._lock:
            self._rejected.add(normalise_instruction(instruction))
            self._write_state(durable=True)

    def stats(self) -> PackStats:
        pack = self._pack
        if pack is None:
            return PackStats(None, None, None, 0, 0, self._hits, len(self._rejected))
        manifest = pack.manifest
        return PackStats(manifest.pack_id, manifest.created, manifest.model, manifest.count,
                         self.path.stat().st_size, self._hits, len(self._rejected))

    # the state file: hits and rejections of the pack in use, reset by a new pack -------
    def _read_state(self, pack: Pack | None) -> dict[str, Any]:
        try:
            state = json.loads((self.directory / STATE_FILE).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        if pack is None or not isinstance(state, dict) \
                or state.get("pack_id") != pack.manifest.pack_id:
            return {}
        return state

    def _write_state(self, durable: bool) -> None:
        """Durable for a rejection; a hit count lost in a crash costs nothing."""
        pack = self._pack
        state = {"pack_id": pack.manifest.pack_id if pack else None, "hits": self._hits,
                 "rejected": sorted(self._rejected)}
        path = self.directory / STATE_FILE
        partial = path.with_name(STATE_FILE + ".partial")
        try:
            partial.write_text(json.dumps(state), encoding="utf-8")
            os.replace(partial, path)
            if durable:
                fsync_path(self.directory)
        except OSError as exc:  # the answer is still right; only the counter is lost
            log.warning("cannot save the pack's hit count in %s: %s", path, exc.strerror)
