"""The device's similarity thresholds, the only reader and writer of their meta keys.

Two values live in the cache's store: the global tau (from the settings, then from the FL
server) and the local tau this device tuned on its own feedback, which wins once it
exists. Every write is checked (``shared.threshold.check_threshold``), and both are carried
into a new vector space when the encoder changes under them.
"""

import logging
from pathlib import Path

import numpy as np
from meancache.client.cache.store import EntryStore
from meancache.shared.threshold import DEFAULT_THRESHOLD, check_threshold, transfer_threshold

log = logging.getLogger(__name__)

GLOBAL = "threshold.global"
LOCAL = "threshold.local"


class ThresholdState:
    """The thresholds kept in ``store``; ``default`` is the global tau until one is set."""

    def __init__(self, store: EntryStore, default: float = DEFAULT_THRESHOLD) -> None:
        self.store = store
        self.default = check_threshold(default)

    def persist_default(self) -> None:
        """Write the default as the global tau unless one is stored: a later change of the
        settings then no longer moves a tau the cache already works with."""
        if self.store.get_meta(GLOBAL) is None:
            self.store.set_meta(GLOBAL, self.default)

    @property
    def global_value(self) -> float:
        return float(self.store.get_meta(GLOBAL, self.default))

    @property
    def local_value(self) -> float | None:
        local = self.store.get_meta(LOCAL)
        return None if local is None else float(local)

    @property
    def current(self) -> float:
        """The tau lookups use: the device's own once tuned, else the global one."""
        local = self.local_value
        return self.global_value if local is None else local

    def set_global(self, value: float) -> None:
        """The FL server's tau (idempotent: an unchanged value writes nothing)."""
        value = check_threshold(value)
        if self.store.get_meta(GLOBAL) != value:
            self.store.set_meta(GLOBAL, value)

    def set_local(self, value: float) -> None:
        self.store.set_meta(LOCAL, check_threshold(value))

    def carry(self, sims_before: np.ndarray, sims_after: np.ndarray) -> None:
        """Similarities shrink or grow in a new vector space (e.g. under PCA): move both
        taus so they separate the same pairs. The arrays hold the same query pairs'
        similarities before and after the change."""
        for name in (GLOBAL, LOCAL):
            old = self.store.get_meta(name)
            if old is not None:
                new = round(transfer_threshold(float(old), sims_before, sims_after), 4)
                self.store.set_meta(name, check_threshold(new))
                log.info("%s carried into the new vector space: %.4f -> %.4f", name, old, new)


def set_global_threshold(cache_dir: Path, value: float) -> None:
    """Set the global tau of the cache in ``cache_dir`` without opening the cache (FL code
    runs beside the chat, which may hold it open)."""
    store = EntryStore(cache_dir)
    try:
        ThresholdState(store).set_global(value)
    finally:
        store.close()
