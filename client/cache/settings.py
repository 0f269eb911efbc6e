"""The cache's settings and their defaults: the one place they are written (the user's
settings, client.config, take theirs from here). Light: no torch, no scikit-learn."""

from dataclasses import dataclass

from meancache.client.cache.policy import CLUSTERINGS, POLICIES, check_choice
from meancache.shared.encoder import DEFAULT_PCA_DIMS
from meancache.shared.threshold import DEFAULT_THRESHOLD


@dataclass(frozen=True)
class MatchSettings:
    """The part of the cache's settings that decides a hit (client.cache.matcher); its
    defaults are CacheSettings'."""

    candidates: int  # the best candidates a source offers
    verify: bool  # veto look-alike candidates that need another answer
    entry_thresholds: bool  # each entry's own threshold, learned from its feedback
    tune_min_per_class: int  # labelled pairs of each kind before tau is re-tuned


@dataclass(frozen=True)
class CacheSettings:
    global_threshold: float = DEFAULT_THRESHOLD
    max_entries: int = 100_000
    max_bytes: int = 512 * 1024 * 1024
    context_aware: bool = True
    pca_dims: int = DEFAULT_PCA_DIMS  # 0 keeps full embeddings
    pca_min_entries: int = 1000
    tune_min_per_class: int = 5
    candidates: int = 8  # nearest entries checked for context agreement
    eviction_policy: str = "lru"  # "lru", "lfu", "scalm-co", "scalm-se" (policy/)
    pattern_clustering: str = "kmeans"  # SCALM's clustering: "kmeans" or "dbscan"
    verify_hits: bool = True  # veto look-alike candidates that need another answer
    entry_thresholds: bool = True  # each entry's own threshold, learned from its feedback

    def __post_init__(self) -> None:
        check_choice("eviction_policy", self.eviction_policy, POLICIES)
        check_choice("pattern_clustering", self.pattern_clustering, CLUSTERINGS)

    @property
    def matching(self) -> MatchSettings:
        return MatchSettings(self.candidates, self.verify_hits, self.entry_thresholds,
                             self.tune_min_per_class)
