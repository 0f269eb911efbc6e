"""The device's instruction pack: loaded once, looked up in O(1) before the semantic
cache, then by meaning (its instructions embedded with the cache's encoder, see
client/pack/embeddings.py), with its hit counts and the answers the user rejected kept
beside it.

Lookups never touch the network: the pack is a local file, read whole into a dict.
"""

import json
import logging
import os
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from meancache.client.cache.verification import verify
from meancache.client.pack.embeddings import PackEmbeddings, stored
from meancache.shared.encoder import Encoder
from meancache.shared.errors import PackError
from meancache.shared.files import fsync_path
from meancache.shared.pack import Pack, read_pack
from meancache.shared.query import normalise_query

log = logging.getLogger(__name__)

SIMILAR_CANDIDATES = 5  # the best instructions at or above tau that verification may veto

PACK_FILE = "current.mcpack"
STATE_FILE = "state.json"


@dataclass(frozen=True)
class PackHit:
    instruction: str  # the normalised instruction that matched
    answer: str
    pack_id: str
    similarity: float = 1.0  # below 1: a semantic match (cosine to the instruction)

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
    hits: int  # exact matches served
    rejected: int
    semantic_hits: int = 0  # answers served by a similar instruction (cosine >= tau)
    embedding: str = "not embedded"  # the state of the instruction vectors


class PackStore:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.path = directory / PACK_FILE
        self._lock = threading.Lock()
        self._pack: Pack | None = None
        self._hits = 0
        self._semantic_hits = 0
        self._rejected: set[str] = set()
        self._rejected_pairs: set[tuple[str, str]] = set()  # (query, instruction)
        self.embeddings = PackEmbeddings(directory)
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
            self._semantic_hits = state.get("semantic_hits", 0)
            self._rejected = set(state.get("rejected", []))
            self._rejected_pairs = {(q, i) for q, i in state.get("rejected_pairs", [])}
        return pack

    def close(self) -> None:
        """Stop a running embedding between two batches (it resumes on the next start)."""
        self.embeddings.close()

    def prepare(self, encoder: Encoder) -> None:
        """Start embedding the pack in use for the semantic match, unless it is ready."""
        pack = self._pack
        if pack is not None:
            self.embeddings.vectors(pack, encoder)

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

    def lookup_similar(self, query: str, encoder: Encoder, tau: float,
                       embed: Callable[[str], np.ndarray] | None = None) -> PackHit | None:
        """The answer of the pack instruction most similar to ``query`` (cosine >= tau) that
        verification does not veto and the user did not reject, or None. None at once
        while the instructions are still being embedded in ``encoder``'s space, and for a
        question past the encoder's window (only its beginning would be compared).
        ``embed``: how to embed the query in that space (the answer path passes the
        cache's, which remembers it for the cache lookup that may follow)."""
        pack = self._pack
        if pack is None or encoder.is_truncated(query):
            return None
        ready = self.embeddings.vectors(pack, encoder)
        if ready is None or not ready.instructions:
            return None
        key = normalise_query(query)
        vector = embed(query) if embed is not None else encoder.encode([query])[0]
        similarities = ready.vectors @ vector
        count = min(SIMILAR_CANDIDATES, len(similarities))
        best = np.argpartition(-similarities, count - 1)[:count]  # O(n), not a full sort
        best = best[np.argsort(-similarities[best])]
        for row in best:
            similarity = float(similarities[row])
            if similarity < tau:
                break
            instruction = ready.instructions[row]
            if instruction in self._rejected or (key, instruction) in self._rejected_pairs:
                continue
            veto = verify(query, instruction)
            if veto is not None:
                log.info("pack match %r for %r vetoed: %s", instruction, query, veto.reason)
                continue
            with self._lock:
                self._semantic_hits += 1
                self._write_state(durable=False)
            return PackHit(instruction, pack.answers[instruction], pack.manifest.pack_id,
                           min(similarity, 1.0))
        return None

    def reject(self, instruction: str) -> None:
        """Never serve this instruction's answer from the current pack again."""
        with self._lock:
            self._rejected.add(normalise_query(instruction))
            self._write_state(durable=True)

    def reject_similar(self, query: str, instruction: str) -> None:
        """Never serve ``instruction``'s answer for ``query`` again (a semantic match was
        wrong for this question; the instruction may still answer itself)."""
        with self._lock:
            self._rejected_pairs.add((normalise_query(query),
                                      normalise_query(instruction)))
            self._write_state(durable=True)

    def stats(self) -> PackStats:
        pack = self._pack
        rejected = len(self._rejected) + len(self._rejected_pairs)
        if pack is None:
            return PackStats(None, None, None, 0, 0, self._hits, rejected,
                             self._semantic_hits)
        manifest = pack.manifest
        return PackStats(manifest.pack_id, manifest.created, manifest.model, manifest.count,
                         self.path.stat().st_size, self._hits, rejected,
                         self._semantic_hits, self._embedding_state(pack))

    def _embedding_state(self, pack: Pack) -> str:
        status = self.embeddings.status()
        if status is not None:
            return f"embedding {status.done}/{status.total or pack.manifest.count}"
        ready = self.embeddings.ready
        if ready is not None and ready.pack_sha256 == pack.manifest.body_sha256:
            return "ready"
        if self.embeddings.background.last_error is not None:
            return self.embeddings.background.last_error
        return "stored, loaded on first use" if stored(self.directory, pack) \
            else "not embedded"

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
                 "semantic_hits": self._semantic_hits, "rejected": sorted(self._rejected),
                 "rejected_pairs": sorted(self._rejected_pairs)}
        path = self.directory / STATE_FILE
        partial = path.with_name(STATE_FILE + ".partial")
        try:
            partial.write_text(json.dumps(state), encoding="utf-8")
            os.replace(partial, path)
            if durable:
                fsync_path(self.directory)
        except OSError as exc:  # the answer is still right; only the counter is lost
            log.warning("cannot save the pack's hit count in %s: %s", path, exc.strerror)
