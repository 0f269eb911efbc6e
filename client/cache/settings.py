"""The cache's settings and their defaults: the one place they are written (the user's
settings, client.config.Settings, inherit these fields). Light: no torch, no scikit-learn."""

from meancache.client.cache.policy import CLUSTERINGS, POLICIES, check_choice
from meancache.shared.encoder import DEFAULT_PCA_DIMS
from meancache.shared.settings import SHOWN
from meancache.shared.threshold import DEFAULT_THRESHOLD, check_threshold
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

# How far under tau a candidate still reaches the learned verifier: the embedding only
# recalls, the verifier decides. A round value, not tuned; benchmarks/verification.py
# measures the decision it gives. The rules check candidates from tau itself.
RECALL_MARGIN = 0.1
# Which verifier checks a hit (with verify_hits on): the learned cross-encoder
# (shared.verifier) with the rule checks it misses kept beside it (the default: better F0.5
# on QQP dev-b and fewer held-out near-misses served than the rules, docs/verification.md),
# or the word rules alone (client.cache.verification; no model loaded).
VERIFIERS = ("rules", "learned")


class MatchSettings(BaseModel):
    """The part of the cache's settings that decides a hit (client.cache.matcher). Each
    field is declared once, here or in CacheSettings: the device's settings
    (client.config.Settings) inherit both, so a user's key is the field itself."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    candidates: int = Field(8, gt=0, description="Nearest entries checked for context "
                            "agreement: the best candidates a source offers.")
    verify_hits: bool = Field(True, description="A verifier checks each hit (`verifier` "
                              "says which).")
    verifier: str = Field("learned", description="Which verifier checks hits: 'learned' "
                          "(a cross-encoder, the rule checks it misses beside it) or 'rules' "
                          "(word rules alone, no model).")
    recall_margin: float = Field(RECALL_MARGIN, ge=0, description="How far under tau a "
                                 "candidate still reaches the learned verifier.")
    entry_thresholds: bool = Field(True, description="Each entry's own threshold, learned "
                                   "from its feedback.")
    max_wrong_rate: float = Field(0.02, gt=0, lt=1, description="The share of answers "
                                  "served from the cache that may be wrong: it serves only "
                                  "where its estimate, learned from its own traffic, keeps "
                                  "under this with 95% confidence (client/learning/bound.py).")
    tune_min_per_class: int = Field(5, gt=0, description="Labelled pairs of each kind "
                                    "(hit, false hit) before tau is re-tuned locally.")

    @field_validator("verifier")
    @classmethod
    def _known_verifier(cls, value: str) -> str:
        return check_choice("verifier", value, VERIFIERS)

    @property
    def learned(self) -> bool:
        """The learned verifier decides (else the rules veto, or nothing checks)."""
        return self.verify_hits and self.verifier == "learned"


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
