"""Progress bars for long work in a terminal (the device's re-embedding and downloads, the
upstream's pack builder), drawn on stderr: a ``shared.progress.Progress`` callback."""

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


class ProgressBar:
    """A ``(done, total)`` callback that shows a bar only once there is work to show."""

    def __init__(self, description: str, console: Console) -> None:
        self._description = description
        self._console = console
        self._progress: Progress | None = None
        self._task = 0

    def __call__(self, done: int, total: int) -> None:
        if self._progress is None:
            self._progress = Progress(
                TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeRemainingColumn(), console=self._console, transient=True,
            )
            self._progress.start()
            self._task = self._progress.add_task(self._description, total=total)
        self._progress.update(self._task, completed=done, total=total)

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        if self._progress is not None:
            self._progress.stop()
