"""The progress callback long work reports through (re-embedding, downloads, evaluation):
one type, so the cache, the encoder, FL sync and the screens agree on its shape."""

from collections.abc import Callable

# progress(done, total); total is 0 while it is not known.
Progress = Callable[[int, int], None]
