"""The cache's settings and their defaults: the one place they are written (the user's
settings, client.config.Settings, inherit these fields). Light: no torch, no scikit-learn."""

from meancache.client.cache.policy import CLUSTERINGS, POLICIES
from meancache.client.matching.settings import MatchSettings
from meancache.shared.encoder import DEFAULT_PCA_DIMS
from meancache.shared.settings import SHOWN, check_choice
from meancache.shared.threshold import DEFAULT_THRESHOLD, check_threshold
from pydantic import AliasChoices, Field, ValidationInfo, field_validator


class CacheSettings(MatchSettings):
    """The cache's settings: the store, the vector space and eviction, and (inherited) the
    matcher's."""

    global_threshold: float = Field(
        DEFAULT_THRESHOLD, validation_alias=AliasChoices("threshold", "global_threshold"),
        description="The global similarity threshold tau until the FL server sends one "
        "(unset: the encoder profile's).", json_schema_extra={SHOWN: "the encoder's profile"})
    max_entries: int = Field(100_000, description="Entries kept before eviction.")
    max_bytes: int = Field(512 * 1024 * 1024, description="Bytes kept before eviction.")
    context_aware: bool = Field(True, description="A hit must agree with the conversation's "
                                "earlier turns, not only the last question.")
    pca_dims: int = Field(DEFAULT_PCA_DIMS, ge=0, description="Dimensions the PCA layer "
                          "keeps (0 keeps full embeddings).")
    pca_min_entries: int = Field(1000, gt=0, description="Entries before the PCA layer is "
                                 "fitted.")
    eviction_policy: str = Field("lru", description="What the cache keeps and evicts: "
                                 + ", ".join(POLICIES) + " (`--eviction-policy`).")
    pattern_clustering: str = Field("kmeans", description="SCALM's clustering of queries: "
                                    "'kmeans' (fast) or 'dbscan'.")

    @field_validator("global_threshold")
    @classmethod
    def _a_threshold(cls, value: float) -> float:
        return check_threshold(value)

    @field_validator("max_entries", "max_bytes")
    @classmethod
    def _positive(cls, value: int, info: ValidationInfo) -> int:
        if value <= 0:  # 0 or less would evict every new answer
            raise ValueError(f"{info.field_name} must be a positive whole number, not {value!r}")
        return value

    @field_validator("eviction_policy")
    @classmethod
    def _known_policy(cls, value: str) -> str:
        return check_choice("eviction_policy", value, POLICIES)

    @field_validator("pattern_clustering")
    @classmethod
    def _known_clustering(cls, value: str) -> str:
        return check_choice("pattern_clustering", value, CLUSTERINGS)

    @property
    def matching(self) -> MatchSettings:
        return MatchSettings(**{name: getattr(self, name) for name in MatchSettings.model_fields})
