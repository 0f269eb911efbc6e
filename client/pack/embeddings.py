"""The pack's instructions embedded with the cache's own encoder, for the semantic match
that follows the exact one.

Embedding a pack takes a while (seconds to minutes on a phone-class CPU), so in the chat it
runs on a ``BackgroundWork`` thread and lookups fall through until it is done: they never
wait for it. A one-shot command (`meancache ask`) makes them before its lookup instead
(``build``), and vectors already on disk are loaded before the first lookup, so the same
question gets the same answer on every run. The vectors are kept beside the pack in one
``.npy`` file named by the pack's sha256 and the encoder's version, written atomically; a
new pack or a new encoder version (an FL round, a PCA fit) finds no file of its name and
is embedded again, and older files are removed.
"""

import hashlib
import logging
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from meancache.client.background import BackgroundWork, JobStatus
from meancache.client.matching.question import embed_texts
from meancache.shared.encoder import Encoder
from meancache.shared.files import atomic_write
from meancache.shared.pack import Pack
from meancache.shared.progress import Progress

log = logging.getLogger(__name__)

EMBEDDINGS_GLOB = "embeddings-*.npy"
JOB_LABEL = "embedding the instruction pack"


@dataclass(frozen=True)
class PackVectors:
    """The vectors of one pack in one encoder's space, row i for instruction i."""

    pack_sha256: str
    encoder_version: str
    instructions: tuple[str, ...]
    vectors: np.ndarray  # (n, dim) float32 unit vectors


def embeddings_path(directory: Path, pack: Pack, encoder_version: str) -> Path:
    """The file of ``pack``'s vectors under ``encoder_version``: its name is the key."""
    encoder_key = hashlib.sha256(encoder_version.encode()).hexdigest()[:16]
    return directory / f"embeddings-{pack.manifest.body_sha256[:16]}-{encoder_key}.npy"


def stored(directory: Path, pack: Pack) -> bool:
    """Whether ``pack``'s vectors are on disk under some encoder (`meancache pack stats`
    loads no encoder, so it cannot tell which)."""
    return any(directory.glob(f"embeddings-{pack.manifest.body_sha256[:16]}-*.npy"))


class PackEmbeddings:
    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.background = BackgroundWork()
        self._lock = threading.Lock()
        self._ready: PackVectors | None = None

    @property
    def ready(self) -> PackVectors | None:
        """The vectors made last (of the pack and encoder they were made for)."""
        with self._lock:
            return self._ready

    def vectors(self, pack: Pack, encoder: Encoder) -> PackVectors | None:
        """``pack``'s vectors in ``encoder``'s space: loaded from disk if stored there
        (milliseconds), else None while a background job makes them (the first call for a
        new pack or encoder starts it; it never waits for it)."""
        ready = self.ready
        if ready is not None and ready.pack_sha256 == pack.manifest.body_sha256 \
                and ready.encoder_version == encoder.version:
            return ready
        if self.background.status() is None:
            path = embeddings_path(self.directory, pack, encoder.version)
            vectors = self._load(path, (len(pack.answers), encoder.dim))
            if vectors is not None:
                return self._keep(pack, encoder, path, vectors)
        self.prepare(pack, encoder)
        return None

    def prepare(self, pack: Pack, encoder: Encoder) -> bool:
        """Load or make ``pack``'s vectors on the worker thread; False if a job runs."""
        return self.background.start(JOB_LABEL, lambda progress: self._build(pack, encoder,
                                                                              progress))

    def status(self) -> JobStatus | None:
        """The embedding's progress while it runs (the chat's status line shows it)."""
        return self.background.status()

    def wait(self, timeout: float | None = None) -> bool:
        return self.background.wait(timeout)

    def close(self) -> None:
        self.background.stop()

    def build(self, pack: Pack, encoder: Encoder, progress: Progress | None = None
              ) -> PackVectors:
        """Load or make ``pack``'s vectors on this thread, with ``progress`` (a job already
        running is waited for first: the work is never done twice)."""
        self.background.wait()
        ready = self.ready
        if ready is None or ready.pack_sha256 != pack.manifest.body_sha256 \
                or ready.encoder_version != encoder.version:
            self._build(pack, encoder, progress)
            ready = self.ready
        assert ready is not None
        return ready

    def _build(self, pack: Pack, encoder: Encoder, progress: Progress | None) -> None:
        instructions = tuple(pack.answers)
        path = embeddings_path(self.directory, pack, encoder.version)
        vectors = self._load(path, (len(instructions), encoder.dim))
        if vectors is None:
            vectors = embed_texts(encoder, instructions, progress)
            try:
                with atomic_write(path, durable=True) as fh:  # a crash leaves the old or none
                    np.save(fh, vectors, allow_pickle=False)
            except OSError as exc:  # the vectors still serve this run
                log.warning("cannot keep the pack's vectors in %s (%s); they are made again "
                            "on the next start", path, exc.strerror or exc)
            else:
                log.info("embedded %d pack instructions into %s", len(instructions), path)
        self._keep(pack, encoder, path, vectors)

    def _keep(self, pack: Pack, encoder: Encoder, path: Path, vectors: np.ndarray
              ) -> PackVectors:
        """Use ``vectors`` (stored at ``path``) from now on; files of older packs or
        encoders are removed."""
        for old in self.directory.glob(EMBEDDINGS_GLOB):
            if old != path:
                old.unlink(missing_ok=True)
        ready = PackVectors(pack.manifest.body_sha256, encoder.version, tuple(pack.answers),
                            vectors)
        with self._lock:
            self._ready = ready
        return ready

    @staticmethod
    def _load(path: Path, shape: tuple[int, int]) -> np.ndarray | None:
        """The stored vectors, if they exist and have the shape this pack needs."""
        try:
            vectors = np.load(path, allow_pickle=False)
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            log.warning("re-embedding the pack: %s is unreadable (%s)", path, exc)
            return None
        if vectors.shape != shape or vectors.dtype != np.float32:
            log.warning("re-embedding the pack: %s holds %s %s, not %s float32", path,
                        vectors.shape, vectors.dtype, shape)
            return None
        return vectors
