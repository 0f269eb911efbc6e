"""`meancache cache stats`'s pictures: the hit rate day by day, and how similar the served
hits were, kept against rejected ("wrong answer"), which shows where tau sits between them.
Drawn as text with plotext, from the store's daily counters and its feedback pairs."""

from typing import Any

import numpy as np
import plotext as plt
from meancache.client.cache.store import EntryStore

DAYS = 30  # the most recent days drawn
WIDTH, HEIGHT = 76, 16
BINS = 8
HIT_RATE_TITLE = "Hit rate per day (share of questions answered from the cache)"
SIMILARITY_TITLE = "Similarity of served hits, kept vs rejected"


def hit_rate_plot(hits: dict[str, int], misses: dict[str, int]) -> str:
    """A bar per day (the last DAYS with a lookup), or a line saying there are none."""
    days = sorted(day for day in hits.keys() | misses.keys()
                  if hits.get(day, 0) + misses.get(day, 0))[-DAYS:]
    if not days:
        return "Hit rate per day: no lookups recorded yet (they are counted from now on)."
    rates = [100 * hits.get(d, 0) / (hits.get(d, 0) + misses.get(d, 0)) for d in days]
    _start()
    plt.bar([d[5:] for d in days], rates, width=0.6)  # MM-DD: the year adds nothing
    plt.ylim(0, 100)
    plt.title(HIT_RATE_TITLE)
    plt.xlabel("day (MM-DD)")
    plt.ylabel("hit rate (%)")
    return str(plt.build())


def similarity_plot(pairs: list[dict[str, Any]], threshold: float) -> str:
    """Side-by-side histograms of the served hits' similarity, kept and rejected, on shared
    bins from just below tau to 1, or a line saying no hit was served yet."""
    kept = [float(p["similarity"]) for p in pairs if int(p["label"]) == 1]
    rejected = [float(p["similarity"]) for p in pairs if int(p["label"]) == 0]
    if not kept and not rejected:
        return "Similarity of served hits: none served yet."
    low = min([*kept, *rejected, threshold]) - 0.005
    edges = np.linspace(low, 1.0, BINS + 1)
    centers = [f"{(a + b) / 2:.3f}" for a, b in zip(edges[:-1], edges[1:], strict=True)]
    counts = [np.histogram(values, edges)[0].tolist() for values in (kept, rejected)]
    _start()
    plt.multiple_bar(centers, counts, labels=[f"kept ({len(kept)})",
                                              f"rejected as wrong ({len(rejected)})"],
                     color=["green", "red"], marker=["sd", "x"])
    plt.title(f"{SIMILARITY_TITLE} (tau {threshold:.3f})")
    plt.xlabel("cosine similarity to the cached question (bin centre)")
    plt.ylabel("hits")
    return str(plt.build())


def stats_plots(store: EntryStore, threshold: float) -> list[str]:
    """Both pictures for the cache in ``store``; ``threshold`` is the tau in use."""
    return [hit_rate_plot(store.daily("hits"), store.daily("misses")),
            similarity_plot(store.pairs(), threshold)]


def _start() -> None:
    plt.clf()
    plt.plotsize(WIDTH, HEIGHT)
