"""Progress for long work (the device's re-embedding and downloads, the upstream's pack
builder) on stderr: a bar on a terminal, plain lines otherwise (a job run under nohup, a
service or a pipe is followed in its output). A ``shared.progress.Progress`` callback."""

import time
from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

LINE_EVERY = 10.0  # seconds between progress lines when stderr is not a terminal


class ProgressBar:
    """A ``(done, total)`` callback that shows progress only once there is work to show:
    a bar on a terminal, else a line at most every ``line_every`` seconds and at the end."""

    def __init__(self, description: str, console: Console,
                 line_every: float = LINE_EVERY) -> None:
        self._description = description
        self._console = console
        self._progress: Progress | None = None
        self._task = 0
        self._line_every = line_every
        self._last_line: float | None = None
        self._started = time.monotonic()

    def __call__(self, done: int, total: int) -> None:
        if not self._console.is_terminal:
            self._line(done, total)
            return
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(), console=self._console, transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=total)
        self._progress.update(self._task, completed=done, total=total)

    def _line(self, done: int, total: int) -> None:
        now = time.monotonic()
        ended = bool(total) and done >= total
        if not ended and self._last_line is not None and \
                now - self._last_line < self._line_every:
            return
        self._last_line = now
        share = f" ({done / total:.0%})" if total else ""
        self._console.print(f"{self._description}: {done}/{total or '?'}{share}, "
                            f"{now - self._started:.0f} s", highlight=False, markup=False,
                            soft_wrap=True)

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
