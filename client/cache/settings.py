"""The cache's settings and their defaults: the one place they are written (the user's
settings, client.config, take theirs from here). Light: no torch, no scikit-learn."""

from dataclasses import dataclass

from meancache.client.cache.policy import CLUSTERINGS, POLICIES, check_choice
from meancache.client.matching.settings import MatchSettings
from meancache.shared.encoder import DEFAULT_PCA_DIMS
from meancache.shared.threshold import DEFAULT_THRESHOLD

# How far under tau a candidate still reaches the learned verifier: the embedding only
# recalls, the verifier decides. A round value, not tuned; benchmarks/verification.py
# measures the decision it gives. The rules check candidates from tau itself.
RECALL_MARGIN = 0.1
# Which verifier checks a hit (with verify_hits on): the learned cross-encoder
# (shared.verifier) with the rule checks it misses kept beside it (the default: better F0.5
# on QQP dev-b and fewer held-out near-misses served than the rules, docs/verification.md),
# or the word rules alone (client.matching.rules; no model loaded).
VERIFIERS = ("rules", "learned")


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
    verify_hits: bool = True  # a verifier checks each hit (``verifier`` says which)
    verifier: str = "learned"  # "learned" or "rules" (VERIFIERS)
    recall_margin: float = RECALL_MARGIN  # the learned verifier's candidates: from tau - this
    entry_thresholds: bool = True  # each entry's own threshold, learned from its feedback

    def __post_init__(self) -> None:
        check_choice("eviction_policy", self.eviction_policy, POLICIES)
        check_choice("pattern_clustering", self.pattern_clustering, CLUSTERINGS)
        check_choice("verifier", self.verifier, VERIFIERS)

    @property
    def matching(self) -> MatchSettings:
        return MatchSettings(self.candidates, self.verify_hits, self.entry_thresholds,
                             self.tune_min_per_class, self.recall_margin, self.verifier)
