"""SCALM's admission: what a full cache still stores."""

from meancache.client.cache.policy.patterns import PatternModel

ADMITTED_RANKS = ("high", "mid")


def admits(model: PatternModel | None, pattern: int | None, full: bool) -> bool:
    """While the cache is cold (not full) every query is stored, and so it is while no
    pattern has saved tokens yet (ranks would say nothing); a full cache stores only
    queries of mid- and high-rank patterns."""
    if not full or model is None or not model.has_savings:
        return True
    return pattern is not None and model.ranks[pattern] in ADMITTED_RANKS
