"""The proxy's caches: one per app namespace and set of system messages. An answer given
after one system prompt ("answer like a pirate") must never answer the same question
asked after another, so each namespace keeps a cache per system prompt it has seen (at
most ``MAX_PER_NAMESPACE``; a request with yet another one goes straight upstream, as
does one of an app past the first ``MAX_NAMESPACES``: keys are free to make). Each
is a whole semantic cache with the chat's settings: the same answer sources in the same
order (the instruction pack only where there are no system messages, as its answers were
made without any), the same ``Matcher``, its own tau tuned by its own feedback, starting
from the device's global one and the error-bound evidence FL pooled (copied from the chat
cache's when the cache is made, then kept up to date by FL: client/fl/device.py).

At most ``MAX_OPEN`` caches are open at once: opening one more closes the least recently
used (a request still using it keeps it until its ``release``; opened again meanwhile,
the two stay in step through the store's generation, as two processes' caches do), and
it opens again on demand. Where they live: client/device_caches.py.
"""

import hashlib
import json
import logging
import random
import threading
from collections import OrderedDict
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from meancache.client.cache import CacheStats, SemanticCache
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import stored_stats
from meancache.client.cache.threshold import ThresholdState
from meancache.client.chat.answering import AnswerService
from meancache.client.config import Settings
from meancache.client.device_caches import proxy_dir
from meancache.client.learning.state import pools
from meancache.client.pack import PackStore
from meancache.client.proxy.eligibility import Bypass
from meancache.client.proxy.exchanges import ExchangeStore
from meancache.client.upstream_client import UpstreamClient
from meancache.client.verifier import device_verifier_card, load_device_verifier
from meancache.shared.encoder import Encoder
from meancache.shared.files import write_json_atomic
from meancache.shared.fl.bound_evidence import BoundEvidence

log = logging.getLogger(__name__)

MAX_PER_NAMESPACE = 16
MAX_NAMESPACES = 32
MAX_OPEN = 16  # caches open at once (each holds its index in memory)
PREAMBLE_FILE = "preamble.json"


def partition_id(preamble: Sequence[tuple[str, str]]) -> str:
    """16 hex digits naming a set of system messages (also for none)."""
    text = json.dumps([list(message) for message in preamble], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _count_dirs(directory: Path) -> int:
    return sum(1 for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else 0


@dataclass(eq=False)
class Partition:
    id: str
    cache: SemanticCache
    exchanges: ExchangeStore
    answers: AnswerService
    users: int = 0  # requests using it now (Partitions.get/find to Partitions.release)

    def close(self) -> None:
        self.cache.close()
        self.exchanges.close()


class Partitions:
    """Opens each cache on first use and keeps the ``MAX_OPEN`` most recently used open
    until ``close``. Every ``get`` or ``find`` that returns a cache must be paired with a
    ``release`` of it once the request is done with it."""

    def __init__(self, settings: Settings, encoder: Encoder, upstream: UpstreamClient,
                 packs: PackStore | None) -> None:
        self.settings = settings
        self.encoder = encoder
        self.upstream = upstream
        self.packs = packs
        self._open: OrderedDict[tuple[str, str], Partition] = OrderedDict()
        self._retired: list[Partition] = []  # out of _open but still in use
        self._opening: dict[tuple[str, str], threading.Lock] = {}  # caches being opened
        self._lock = threading.Lock()

    def _chat_global(self) -> tuple[float, tuple[BoundEvidence, ...]] | None:
        """The chat cache's global tau and pooled bound evidence (the FL server's: a pool
        per judge), if the chat has a cache."""
        if not (self.settings.cache_dir / "cache.db").exists():
            return None
        store = EntryStore(self.settings.cache_dir)
        try:
            return (ThresholdState(store, self.settings.global_threshold).global_value,
                    pools(store))
        finally:
            store.close()

    def get(self, namespace: str, preamble: Sequence[tuple[str, str]]
            ) -> Partition | Bypass:
        """The cache of ``namespace`` for these system messages, made if need be, or why
        none may be made (the limits above). Blocking: a first open loads the cache (run
        it in a worker thread)."""
        pid = partition_id(preamble)
        directory = proxy_dir(self.settings) / namespace / pid
        with self._lock:
            if (namespace, pid) in self._open:
                return self._use((namespace, pid))
            if not directory.parent.exists() and \
                    _count_dirs(directory.parent.parent) >= MAX_NAMESPACES:
                return Bypass("apps")
            made = not directory.exists()
            if made:
                if _count_dirs(directory.parent) >= MAX_PER_NAMESPACE:
                    return Bypass("system-prompts")
                directory.mkdir(parents=True)
                write_json_atomic(directory / PREAMBLE_FILE, [list(m) for m in preamble])
        return self._opened((namespace, pid), directory, preamble, made)

    def find(self, namespace: str, pid: str) -> Partition | None:
        """An existing cache of ``namespace`` (feedback names it by its id)."""
        directory = proxy_dir(self.settings) / namespace / pid
        with self._lock:
            if (namespace, pid) in self._open:
                return self._use((namespace, pid))
        try:
            stored = json.loads((directory / PREAMBLE_FILE).read_text(encoding="utf-8"))
            preamble = [(str(role), str(text)) for role, text in stored]
        except (OSError, ValueError, TypeError) as exc:
            log.info("no proxy cache %s/%s: %s", namespace, pid, exc)
            return None
        return self._opened((namespace, pid), directory, preamble, made=False)

    def stats(self, namespace: str) -> list[tuple[str, CacheStats]]:
        """Each cache of ``namespace`` (one per set of system messages) with its
        statistics, the learned wrong rate among them: an open cache's own, a closed one's
        read from its store without opening it (no index, no eviction of an open one).
        Blocking: run it in a worker thread."""
        directory = proxy_dir(self.settings) / namespace
        pids = sorted(p.name for p in directory.iterdir() if p.is_dir()) \
            if directory.is_dir() else []
        found = []
        for pid in pids[:MAX_PER_NAMESPACE]:
            with self._lock:
                partition = self._use((namespace, pid)) if (namespace, pid) in self._open \
                    else None
            if partition is not None:
                try:
                    found.append((pid, partition.cache.stats()))
                finally:
                    self.release(partition)
            elif (directory / pid / "cache" / "cache.db").exists():
                with closing(EntryStore(directory / pid / "cache")) as store:
                    found.append((pid, stored_stats(
                        store, self.settings.global_threshold, self.settings.encoder_backend,
                        self.settings.max_wrong_rate,
                        device_verifier_card(self.settings) if self.settings.learned else None,
                        self.settings.learned_decision, self.settings.learns_from_answers,
                        self.settings.explore_rate, self.settings.explore_warmup)))
        return found

    def _opened(self, key: tuple[str, str], directory: Path,
                preamble: Sequence[tuple[str, str]], made: bool) -> Partition:
        """The cache of ``key``, opened by this request or by the one already opening it.
        Opening a cache loads its index from disk, so it happens outside ``_lock``: only
        requests for this same cache wait for it, never another app's hits."""
        with self._lock:
            opening = self._opening.setdefault(key, threading.Lock())
        with opening:
            with self._lock:
                if key in self._open:
                    return self._use(key)
            try:
                partition = self._load(key[1], directory, preamble)
                try:
                    if made and (chat := self._chat_global()) is not None:
                        partition.cache.thresholds.set_global(chat[0])
                        if chat[1]:
                            partition.cache.learned.install_pooled(*chat[1])
                except BaseException:
                    partition.close()
                    raise
            finally:
                with self._lock:
                    self._opening.pop(key, None)
            with self._lock:
                return self._admit(key, partition)

    def _load(self, pid: str, directory: Path,
              preamble: Sequence[tuple[str, str]]) -> Partition:
        settings = self.settings
        cache = SemanticCache(directory / "cache", self.encoder, settings.cache_settings(),
                              rng=random.Random(),  # it explores (settings.explore_rate)
                              verifier=load_device_verifier(settings))
        exchanges = ExchangeStore(directory / "exchanges")
        answers = AnswerService(
            cache, self.upstream, exchanges, settings.answer_max_tokens,
            settings.temperature, None if preamble else self.packs,
            preamble=[{"role": role, "content": text} for role, text in preamble])
        return Partition(pid, cache, exchanges, answers)

    def _admit(self, key: tuple[str, str], partition: Partition) -> Partition:
        """Keep ``partition`` open (under ``_lock``), closing the least recently used past
        ``MAX_OPEN`` once no request uses it."""
        self._open[key] = partition
        while len(self._open) > MAX_OPEN:
            _, oldest = self._open.popitem(last=False)
            if oldest.users:
                self._retired.append(oldest)
            else:
                oldest.close()
        return self._use(key)

    def _use(self, key: tuple[str, str]) -> Partition:
        self._open.move_to_end(key)
        partition = self._open[key]
        partition.users += 1
        return partition

    def release(self, partition: Partition) -> None:
        """A request is done with ``partition``: closed now if it is no longer kept open."""
        with self._lock:
            partition.users -= 1
            if not partition.users and partition in self._retired:
                self._retired.remove(partition)
                partition.close()

    def close(self) -> None:
        """Close every cache, in use or not (at shutdown)."""
        with self._lock:
            closing = [*self._open.values(), *self._retired]
            for partition in closing:
                partition.close()
            self._open.clear()
            self._retired.clear()
        if closing:
            log.info("closed %d proxy caches", len(closing))
