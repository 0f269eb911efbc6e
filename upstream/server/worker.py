"""One thread owns the model: requests are queued and run one at a time, so two requests
never interleave on one KV cache, and the event loop never blocks on a forward pass; each
API key has its own queue, and the keys take turns."""

import asyncio
import logging
import threading
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from meancache.upstream.errors import ServerBusyError

log = logging.getLogger(__name__)

_DONE = object()


@dataclass
class Job:
    """Work for the model thread; its results are delivered to an asyncio queue."""

    run: Callable[[threading.Event], Iterator[Any]]
    loop: asyncio.AbstractEventLoop
    results: asyncio.Queue[Any] = field(default_factory=asyncio.Queue)
    cancel: threading.Event = field(default_factory=threading.Event)


class ModelWorker:
    """The model thread and its queues: one queue per tenant (API key), served in turn, so
    a key with many requests waiting delays another key's next request by at most the job
    running now. At most ``max_queued`` jobs wait in all and ``max_queued_per_key`` for one
    key; more are refused (429) instead of holding memory and sockets for hours."""

    def __init__(self, max_queued: int = 64, max_queued_per_key: int = 8) -> None:
        self.max_queued = max_queued
        self.max_queued_per_key = max_queued_per_key
        self._queues: dict[str, deque[Job]] = {}  # tenant -> its waiting jobs, oldest first
        self._turns: deque[str] = deque()  # tenants with waiting jobs, next to be served first
        self._ready = threading.Condition()
        self._running: str | None = None  # the tenant whose job the model thread runs
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name="model-worker", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        with self._ready:
            return sum(len(jobs) for jobs in self._queues.values())

    def queued_for(self, tenant: str) -> int:
        with self._ready:
            return len(self._queues.get(tenant, ()))

    def close(self) -> None:
        with self._ready:
            self._closed = True
            self._ready.notify()
        self._thread.join(timeout=10)

    def admit(self, tenant: str = "") -> None:
        """Raise ServerBusyError if ``tenant`` may queue no more work now: called before a
        request's body is read, and again when its job is queued."""
        waiting = self.queued_for(tenant)
        if waiting >= self.max_queued_per_key:
            raise ServerBusyError(f"this API key has {waiting} requests waiting for the model; "
                                  "wait for one to finish before sending another")
        if self.queued >= self.max_queued:
            raise ServerBusyError(f"the server is busy: {self.max_queued} requests are already "
                                  "waiting for the model; retry in a few seconds")

    async def stream(self, run: Callable[[threading.Event], Iterator[Any]],
                     tenant: str = "") -> AsyncIterator[Any]:
        """Run ``run`` on the model thread in ``tenant``'s turn; yield what it yields.
        Leaving the loop early (a client gone) sets the job's cancel event, and the model
        thread stops at the next token; a job cancelled while still queued never starts."""
        job = Job(run, asyncio.get_running_loop())
        with self._ready:
            self.admit(tenant)  # the lock is re-entrant: no job slips in between
            jobs = self._queues.setdefault(tenant, deque())
            if tenant not in self._turns and tenant != self._running:
                self._turns.append(tenant)
            jobs.append(job)
            self._ready.notify()
        try:
            while True:
                item = await job.results.get()
                if item is _DONE:
                    return
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            job.cancel.set()

    async def call(self, fn: Callable[[], Any], tenant: str = "") -> Any:
        """Run ``fn`` on the model thread in ``tenant``'s turn and return its result."""
        async for result in self.stream(lambda cancel: iter([fn()]), tenant):
            return result
        raise RuntimeError("the model thread returned nothing")

    def _next(self) -> tuple[str, Job] | None:
        """The oldest job of the tenant whose turn it is (None once closed)."""
        with self._ready:
            while not self._turns and not self._closed:
                self._ready.wait()
            if self._closed:
                return None
            tenant = self._turns.popleft()
            self._running = tenant
            return tenant, self._queues[tenant].popleft()

    def _done(self, tenant: str) -> None:
        """After a tenant's job: it goes to the back of the turns if more of its jobs wait
        (only now, so a tenant that queued while this job ran goes first)."""
        with self._ready:
            self._running = None
            if self._queues.get(tenant):
                self._turns.append(tenant)
            else:
                self._queues.pop(tenant, None)

    def _serve(self) -> None:
        while (picked := self._next()) is not None:
            tenant, job = picked
            try:
                if not job.cancel.is_set():
                    self._run(job)
            finally:
                self._done(tenant)

    def _run(self, job: Job) -> None:
        try:
            for item in job.run(job.cancel):
                self._deliver(job, item)
                if job.cancel.is_set():
                    break
            self._deliver(job, _DONE)
        except Exception as exc:  # delivered to the request, which maps it to a status
            self._deliver(job, exc)
    @staticmethod
    def _deliver(job: Job, item: Any) -> None:
        try:
            job.loop.call_soon_threadsafe(job.results.put_nowait, item)
        except RuntimeError:  # the request's event loop has closed: nobody is listening
            job.cancel.set()
