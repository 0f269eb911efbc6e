"""Blocking work started from the app (downloads, exports, re-embedding): it runs in a
thread worker, and what it did, or why it failed, becomes one notice. An error escaping a
Textual worker would end the app."""

from collections.abc import Callable

from meancache.shared.errors import MeanCacheError
from textual.dom import DOMNode
from textual.worker import Worker


def run_blocking(node: DOMNode, job: Callable[[], str | None], *, group: str,
                 title: str, failed: str, then: Callable[[], None] | None = None
                 ) -> Worker[None]:
    """Run ``job`` in a thread (one per ``group`` at a time); its message, when it returns
    one, is a notice titled ``title``, its error one titled ``failed``; ``then`` runs on the
    app's thread after either."""
    app = node.app

    def run() -> None:
        try:
            message = job()
        except MeanCacheError as exc:
            app.call_from_thread(app.notify, str(exc), title=failed, severity="error")
            return
        finally:
            if then is not None:
                app.call_from_thread(then)
        if message:
            app.call_from_thread(app.notify, message, title=title)

    return node.run_worker(run, thread=True, group=group, exclusive=True)
