"""The proxy's caches: one per app namespace and set of system messages. An answer given
after one system prompt ("answer like a pirate") must never answer the same question
asked after another, so each namespace keeps a cache per system prompt it has seen (at
most ``MAX_PER_NAMESPACE``; a request with yet another one goes straight upstream, as
does one of an app past the first ``MAX_NAMESPACES``: keys are free to make). Each
is a whole semantic cache with the chat's settings: the same answer sources in the same
order (the instruction pack only where there are no system messages, as its answers were
made without any), the same ``Matcher``, its own tau tuned by its own feedback, starting
from the chat cache's global one.

Where they live: client/proxy/layout.py.
"""

import hashlib
import json
import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from meancache.client.cache import SemanticCache
from meancache.client.cache.store import EntryStore
from meancache.client.cache.threshold import ThresholdState
from meancache.client.chat.answering import AnswerService
from meancache.client.config import Settings
from meancache.client.pack import PackStore
from meancache.client.proxy.eligibility import Bypass
from meancache.client.proxy.exchanges import ExchangeStore
from meancache.client.proxy.layout import proxy_dir
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.encoder import Encoder
from meancache.shared.files import write_json_atomic

log = logging.getLogger(__name__)

MAX_PER_NAMESPACE = 16
MAX_NAMESPACES = 32
PREAMBLE_FILE = "preamble.json"


def partition_id(preamble: Sequence[tuple[str, str]]) -> str:
    """16 hex digits naming a set of system messages (also for none)."""
    text = json.dumps([list(message) for message in preamble], ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _count_dirs(directory: Path) -> int:
    return sum(1 for p in directory.iterdir() if p.is_dir()) if directory.is_dir() else 0


@dataclass
class Partition:
    id: str
    cache: SemanticCache
    exchanges: ExchangeStore
    answers: AnswerService

    def close(self) -> None:
        self.cache.close()
        self.exchanges.close()


class Partitions:
    """Opens each cache on first use and keeps it open until ``close``."""

    def __init__(self, settings: Settings, encoder: Encoder, upstream: UpstreamClient,
                 packs: PackStore | None) -> None:
        self.settings = settings
        self.encoder = encoder
        self.upstream = upstream
        self.packs = packs
        self._open: dict[tuple[str, str], Partition] = {}
        self._lock = threading.Lock()
        self._global_tau = self._chat_global_tau()

    def _chat_global_tau(self) -> float | None:
        """The chat cache's global tau (the FL server's), if the chat has a cache."""
        if not (self.settings.cache_dir / "cache.db").exists():
            return None
        store = EntryStore(self.settings.cache_dir)
        try:
            return ThresholdState(store, self.settings.threshold).global_value
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
                return self._open[(namespace, pid)]
            if not directory.parent.exists() and \
                    _count_dirs(directory.parent.parent) >= MAX_NAMESPACES:
                return Bypass("apps")
            if not directory.exists():
                if _count_dirs(directory.parent) >= MAX_PER_NAMESPACE:
                    return Bypass("system-prompts")
                directory.mkdir(parents=True)
                write_json_atomic(directory / PREAMBLE_FILE, [list(m) for m in preamble])
            return self._load(namespace, pid, directory, preamble)

    def find(self, namespace: str, pid: str) -> Partition | None:
        """An existing cache of ``namespace`` (feedback names it by its id)."""
        directory = proxy_dir(self.settings) / namespace / pid
        with self._lock:
            if (namespace, pid) in self._open:
                return self._open[(namespace, pid)]
            try:
                stored = json.loads((directory / PREAMBLE_FILE).read_text(encoding="utf-8"))
                preamble = [(str(role), str(text)) for role, text in stored]
            except (OSError, ValueError, TypeError) as exc:
                log.info("no proxy cache %s/%s: %s", namespace, pid, exc)
                return None
            return self._load(namespace, pid, directory, preamble)

    def _load(self, namespace: str, pid: str, directory: Path,
              preamble: Sequence[tuple[str, str]]) -> Partition:
        settings = self.settings
        cache = SemanticCache(directory / "cache", self.encoder, settings.cache_settings())
        if self._global_tau is not None:
            cache.thresholds.set_global(self._global_tau)
        exchanges = ExchangeStore(directory / "exchanges")
        answers = AnswerService(
            cache, self.upstream, exchanges, settings.answer_max_tokens,
            settings.temperature, None if preamble else self.packs,
            preamble=[{"role": role, "content": text} for role, text in preamble])
        partition = Partition(pid, cache, exchanges, answers)
        self._open[(namespace, pid)] = partition
        return partition

    def close(self) -> None:
        with self._lock:
            for partition in self._open.values():
                partition.close()
            self._open.clear()
