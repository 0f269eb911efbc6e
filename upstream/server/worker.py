"""One thread owns the model: requests are queued and run one at a time, so two requests
never interleave on one KV cache, and the event loop never blocks on a forward pass."""

import asyncio
import logging
import queue
import threading
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
    """The model thread and its queue; at most ``max_queued`` jobs wait, so a flood of
    requests is refused (429) instead of holding memory and sockets for hours."""

    def __init__(self, max_queued: int = 16) -> None:
        self.max_queued = max_queued
        self._jobs: queue.Queue[Job | None] = queue.Queue()
        self._thread = threading.Thread(target=self._serve, name="model-worker", daemon=True)
        self._thread.start()

    @property
    def queued(self) -> int:
        return self._jobs.qsize()

    def close(self) -> None:
        self._jobs.put(None)
        self._thread.join(timeout=10)

    async def stream(self, run: Callable[[threading.Event], Iterator[Any]]) -> AsyncIterator[Any]:
        """Run ``run`` on the model thread; yield what it yields. Leaving the loop early (a
        client gone) sets the job's cancel event, and the model thread stops at the next
        token; a job cancelled while still queued never starts."""
        if self._jobs.qsize() >= self.max_queued:
            raise ServerBusyError(f"the server is busy: {self.max_queued} requests are already "
                                  "waiting for the model; retry in a few seconds")
        job = Job(run, asyncio.get_running_loop())
        self._jobs.put(job)
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

    async def call(self, fn: Callable[[], Any]) -> Any:
        """Run ``fn`` on the model thread and return its result."""
        async for result in self.stream(lambda cancel: iter([fn()])):
            return result
        raise RuntimeError("the model thread returned nothing")

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if job.cancel.is_set():
                continue
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
