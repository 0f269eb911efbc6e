"""What the cache keeps and what it evicts: LRU, LFU, and SCALM's semantic patterns.

Only the policy names live here, so settings can check a value without importing
scikit-learn; the machinery is in the modules beside this one.
"""

POLICIES = ("lru", "lfu", "scalm-co", "scalm-se")
CLUSTERINGS = ("kmeans", "dbscan")


def check_choice(setting: str, value: str, valid: tuple[str, ...]) -> str:
    """``value`` if it is one of ``valid``; else a ValueError naming it and the valid ones."""
    if value not in valid:
        raise ValueError(f"{setting} {value!r} is unknown; valid: {', '.join(valid)}")
    return value
