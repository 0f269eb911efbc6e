"""Long work off the answer path: the cache's changes of vector space (fitting PCA,
re-embedding) and the pack's instruction vectors, each owner with its own worker.

One job at a time runs on a daemon thread. Its progress is a value anyone may read (the
chat polls it for its status line), and ``stop`` ends it between two batches, so closing
the cache never pulls the store away from a job that is still writing.
"""

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from meancache.client.errors import CacheWorkStopped
from meancache.shared.progress import Progress

log = logging.getLogger(__name__)

@dataclass(frozen=True)
class JobStatus:
    label: str  # what the job does, for a status line
    done: int
    total: int  # 0 while it is not known


class BackgroundWork:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._status: JobStatus | None = None
        self._stop = threading.Event()
        self.last_error: str | None = None  # why the last job failed, if it did

    def start(self, label: str, job: Callable[[Progress], object]) -> bool:
        """Run ``job(progress)`` on the worker thread; False if a job is running already."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return False
            self._stop.clear()
            self._status = JobStatus(label, 0, 0)
            self._thread = threading.Thread(target=self._run, args=(label, job),
                                            name=f"meancache cache: {label}", daemon=True)
            self._thread.start()
            return True

    def _run(self, label: str, job: Callable[[Progress], object]) -> None:
        def progress(done: int, total: int) -> None:
            if self._stop.is_set():
                raise CacheWorkStopped(f"{label} was asked to stop")
            with self._lock:
                self._status = JobStatus(label, done, total)

        try:
            job(progress)
            self.last_error = None
        except CacheWorkStopped:
            log.info("%s stopped before it finished; it resumes on the next start", label)
        except Exception as exc:  # a failed job must not kill the app; lookups go on
            log.exception("%s failed", label)
            self.last_error = f"{label} failed: {exc}"
        finally:
            with self._lock:
                self._status = None

    def status(self) -> JobStatus | None:
        """The running job's progress, or None when nothing runs."""
        with self._lock:
            return self._status

    @property
    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        """Wait for the running job; False if it is still running after ``timeout``."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout)
        return not self.running

    def stop(self, timeout: float | None = None) -> None:
        """Ask the running job to stop at its next batch and wait for it."""
        self._stop.set()
        self.wait(timeout)
