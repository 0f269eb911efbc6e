"""The settings a decision reads, and their defaults: declared once here (the cache's
settings and the device's inherit them). Light: no torch, no scikit-learn."""

from meancache.client.learning.explore import (
    DECISION_EXPLORE_RATE,
    DECISION_EXPLORE_WIDTH,
    EXPLORE_BEYOND,
    EXPLORE_RATE,
    EXPLORE_WARMUP,
    EXPLORE_WIDTH,
)
from meancache.shared.settings import check_choice
from pydantic import BaseModel, ConfigDict, Field, field_validator

# How far under tau a candidate still reaches the learned verifier: the embedding only
# recalls, the verifier decides. A round value, not tuned; benchmarks/verification.py
# measures the decision it gives. The rules check candidates from tau itself.
RECALL_MARGIN = 0.1
# Which verifier checks a hit (with verify_hits on): the learned cross-encoder
# (shared.verifier) with the rule checks it misses kept beside it (the default: better F0.5
# on QQP dev-b and fewer held-out near-misses served than the rules, docs/verification.md),
# or the word rules alone (client.matching.rules; no model loaded).
VERIFIERS = ("rules", "learned")
# How the learned verifier's pick is decided: "learned" (the default: a logistic model over
# the candidates' cosines and probabilities, shared/verifier/decision.py; more hits at a
# higher hit precision than "rules" on the test splits of QQP and two generated domains,
# benchmarks/decision_study.py, docs/verification.md) or "rules" (served if its
# probability reaches the card's threshold, no other candidate's does too, and the kept
# rule checks do not veto it).
DECISIONS = ("rules", "learned")


class MatchSettings(BaseModel):
    """The part of the cache's settings that decides a hit (client.matching.matcher). Each
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
    decision: str = Field("learned", description="How the learned verifier's pick is "
                          "decided: 'learned' (a fitted model over the candidates' cosines "
                          "and probabilities, the kept rule checks beside it) or 'rules' (it "
                          "alone reaches the verifier's threshold and the kept rule checks "
                          "pass it).")
    recall_margin: float = Field(RECALL_MARGIN, ge=0, description="How far under tau a "
                                 "candidate still reaches the judge: the learned verifier, or "
                                 "with it off the learned bound on the cosine.")
    entry_thresholds: bool = Field(True, description="Each entry's own threshold, learned "
                                   "from its feedback.")
    max_wrong_rate: float = Field(0.02, gt=0, lt=1, description="The share of answers "
                                  "served from the cache that may be wrong: once its labels "
                                  "(its own traffic's, or pooled by federated learning) back "
                                  "a threshold, it serves only where its estimate keeps under "
                                  "this with 95% confidence. The learned decision's card "
                                  "ships labels of its own that back its first threshold; "
                                  "with the verifier's probability or the cosine as judge, "
                                  "their own threshold serves until labels back one "
                                  "(client/learning/bound.py).")
    explore_rate: float | None = Field(None, ge=0, le=1, description="The share of "
                                       "would-be hits near the learned threshold that the chat "
                                       "and the proxy ask upstream instead, showing the fresh "
                                       "answer and labelling the pair, so the bound keeps "
                                       "learning where the cache serves "
                                       "(client/learning/explore.py); 0 turns exploration off. "
                                       f"Unset: the judge's own, {DECISION_EXPLORE_RATE} for "
                                       "the learned decision's score, "
                                       f"{EXPLORE_RATE} for the verifier's probability and "
                                       "the cosine.")
    explore_width: float | None = Field(None, ge=0, le=1, description="How far above the "
                                        "learned threshold (in the judge's score: the learned "
                                        "decision's, the verifier's probability, or the cosine) "
                                        "a would-be hit counts as near it, and may be explored. "
                                        f"Unset: {DECISION_EXPLORE_WIDTH} for the learned "
                                        f"decision's score, {EXPLORE_WIDTH} for the others.")
    explore_beyond_rate: float | None = Field(None, ge=0, le=1, description="The share of "
                                              "would-be hits above the near band (anywhere "
                                              "else the cache serves) also asked upstream, "
                                              "before and after the labels settle, so that "
                                              "a judge's highest scores are checked too "
                                              "(client/learning/explore.py). Unset: "
                                              f"{EXPLORE_BEYOND}.")
    explore_warmup: int | None = Field(None, ge=0, description="Until this many of the "
                                       "device's own labels score over the learned "
                                       "threshold, and while more of them than "
                                       "max_wrong_rate are wrong, every would-be hit is "
                                       "asked upstream and labelled, so that evidence from "
                                       "elsewhere (the "
                                       "decision card's) is checked against this traffic "
                                       "before it serves (client/learning/explore.py). "
                                       f"Unset: {EXPLORE_WARMUP}.")
    explore_until_learned: bool = Field(True, description="Explore every near would-be hit "
                                        "until labels of traffic settle the threshold (they "
                                        "chose it, at least 149 of this device's, with the "
                                        "federation's pool, score over it at 2%, and at most "
                                        "2% of those are wrong), then "
                                        "`explore_rate` of them: the learned decision's card "
                                        "backs its first threshold with labels of its choose "
                                        "splits, which traffic unlike them must check first "
                                        "(docs/cache.md); false: `explore_rate` from the "
                                        "start.")
    learn_from_answers: bool | None = Field(None, description="Label the cache's own "
                                            "traffic by whether the upstream's fresh answer "
                                            "agrees with a candidate's cached one (declined "
                                            "candidates and exploration). Unset: with an "
                                            "upstream you name (`upstream_url`), not with the "
                                            "embedded demo model, whose answers to reworded "
                                            "questions differ too often to say whether the "
                                            "questions were the same (docs/cache.md). "
                                            "'wrong answer' labels either way.")
    tune_min_per_class: int = Field(5, gt=0, description="Labelled pairs of each kind "
                                    "(hit, false hit) before tau is re-tuned locally.")

    @field_validator("verifier")
    @classmethod
    def _known_verifier(cls, value: str) -> str:
        return check_choice("verifier", value, VERIFIERS)

    @field_validator("decision")
    @classmethod
    def _known_decision(cls, value: str) -> str:
        return check_choice("decision", value, DECISIONS)

    @property
    def learned(self) -> bool:
        """The learned verifier decides (else the rules veto, or nothing checks)."""
        return self.verify_hits and self.verifier == "learned"
