"""Which entries leave a cache over its limits: LRU, LFU, or SCALM's rank-seeded LFU."""

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Usage:
    """What eviction knows of one entry."""

    last_used: float
    created: float
    hits: int
    nbytes: int
    priority: int = 0  # SCALM's starting priority (3 / 2 / 1 by its pattern's rank)


def eviction_order(policy: str, usage: Mapping[str, Usage]) -> list[str]:
    """Entry ids, first to evict first. LFU and SCALM evict the older entry of a tie."""
    if policy == "lru":
        return sorted(usage, key=lambda i: (usage[i].last_used, usage[i].created))
    if policy == "lfu":
        return sorted(usage, key=lambda i: (usage[i].hits, usage[i].created))
    return sorted(usage, key=lambda i: (usage[i].priority + usage[i].hits, usage[i].created))


def victims(policy: str, usage: Mapping[str, Usage], over_count: int, over_bytes: int
            ) -> list[str]:
    """The first entries in eviction order whose removal brings both limits back."""
    chosen: list[str] = []
    for entry_id in eviction_order(policy, usage):
        if over_count <= 0 and over_bytes <= 0:
            break
        chosen.append(entry_id)
        over_count -= 1
        over_bytes -= usage[entry_id].nbytes
    return chosen
