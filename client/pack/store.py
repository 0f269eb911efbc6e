"""The device's instruction pack: loaded once, looked up in O(1) before the semantic
cache, then by meaning (its instructions embedded with the cache's encoder, see
client/pack/embeddings.py, offered to the ``Matcher`` (client/matching/), which decides
for the cache too), with its hit counts and the answers the user rejected kept beside it.

Lookups never touch the network: the pack is a local file, read whole into a dict.
"""

import json
import logging
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meancache.client.matching.origins import PackOrigin
from meancache.client.matching.question import Match, NoMatch, Query
from meancache.client.pack.embeddings import PackEmbeddings, stored
from meancache.shared.encoder import Encoder
from meancache.shared.errors import PackError
from meancache.shared.files import write_json_atomic
from meancache.shared.pack import Pack, read_pack
from meancache.shared.progress import Progress
from meancache.shared.query import normalise_query

if TYPE_CHECKING:  # the matcher (its verifier loads scikit-learn, seconds) is imported
    # only by the similar match: an exact lookup (`meancache ask`'s fast path) needs none
    from meancache.client.matching.matcher import Matcher

log = logging.getLogger(__name__)

PACK_FILE = "current.mcpack"
STATE_FILE = "state.json"


@dataclass(frozen=True)
class PackHit:
    answer: str
    origin: PackOrigin  # what a rejection of this answer refers to

    @property
    def instruction(self) -> str:
        """The normalised instruction that matched."""
        return self.origin.instruction

    @property
    def similarity(self) -> float:
        """1.0 for an exact match; below it, the cosine of a similar instruction."""
        return self.origin.similarity


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

    def prepare(self, encoder: Encoder, progress: Progress | None = None, *,
                wait: bool = False) -> None:
        """Make the pack in use ready for the semantic match: vectors stored on disk are
        loaded now, missing ones made on a background job, or here (``wait``, a one-shot
        command, with ``progress``)."""
        pack = self._pack
        if pack is None:
            return
        if wait:
            self.embeddings.build(pack, encoder, progress)
        else:
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
        return PackHit(found[1], PackOrigin(uuid.uuid4().hex, pack.manifest.pack_id,
                                            found[0], 1.0, exact=True))

    def lookup_similar(self, query: str | Query, matcher: "Matcher") -> PackHit | NoMatch:
        """The answer of the pack instruction the matcher accepts for ``query`` (the same
        rule as the semantic cache's: tau, candidate count, verification, over-long
        questions), among those the user did not reject; else the matcher's reason (a
        declined near match among them), at once while the instructions are being embedded
        in the matcher's space."""
        pack = self._pack
        if pack is None:
            return NoMatch("no instruction pack")
        ready = self.embeddings.vectors(pack, matcher.encoder)
        if ready is None or not ready.instructions:
            return NoMatch("the pack's instructions are still being embedded")
        question = matcher.question(query)

        def offered(instruction: str) -> bool:
            return instruction not in self._rejected and \
                (question.key, instruction) not in self._rejected_pairs

        decision = matcher.decide(question, matcher.nearest(
            question, ready.vectors, ready.instructions, offered))
        if not isinstance(decision, Match):
            return decision
        with self._lock:
            self._semantic_hits += 1
            self._write_state(durable=False)
        instruction = decision.candidate.key
        return PackHit(pack.answers[instruction],
                       PackOrigin(uuid.uuid4().hex, pack.manifest.pack_id, instruction,
                                  decision.candidate.similarity, exact=False))

    def reject(self, question: str, origin: PackOrigin) -> None:
        """The pack's answer to ``question`` was wrong: an exact match's answer is never
        served again, a similar instruction's never again for this question (it may still
        answer itself). Tau and the labelled pairs learn it through the ``Matcher``."""
        with self._lock:
            if origin.exact:
                self._rejected.add(normalise_query(origin.instruction))
            else:
                self._rejected_pairs.add((normalise_query(question),
                                          normalise_query(origin.instruction)))
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
        try:
            write_json_atomic(path, state, durable)
        except OSError as exc:  # the answer is still right; only the counter is lost
            log.warning("cannot save the pack's hit count in %s: %s", path, exc.strerror)
