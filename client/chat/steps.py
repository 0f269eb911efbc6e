"""The chat's start, step by step: what ``ChatSession.open`` does, named, so that the app
can say which step is under way (and number it) instead of one bare "loading". Light on
purpose: the app imports it before anything heavy, to draw at once."""

from collections.abc import Callable

from meancache.client.config import Settings
from meancache.shared.progress import Progress

# Opens a named step and returns its (done, total) callback.
StepReporter = Callable[[str], Progress]

LOADING = "loading meancache (the cache and the encoder's runtime)"


def startup_steps(settings: Settings) -> list[str]:
    """The chat's start: loading the program, then the steps ``ChatSession.open`` takes
    with these settings, in order."""
    first = ["checking the upstream"] if settings.upstream_url else []
    last = [] if settings.upstream_url else [
        "starting the language model (the first start prepares it)"]
    return [LOADING, *first, "assembling the encoder (first start only)",
            "loading the encoder (the first start exports it)", "opening the cache", *last]
