"""The settings a decision reads. Light: no torch, no scikit-learn."""

from dataclasses import dataclass


@dataclass(frozen=True)
class MatchSettings:
    """The part of the cache's settings that decides a hit (client.matching.matcher); its
    defaults are CacheSettings'."""

    candidates: int  # the best candidates a source offers
    verify: bool  # the verifier checks candidates (see ``verifier``)
    entry_thresholds: bool  # each entry's own threshold, learned from its feedback
    tune_min_per_class: int  # labelled pairs of each kind before tau is re-tuned
    recall_margin: float = 0.0  # how far under tau candidates reach the learned verifier
    verifier: str = "learned"  # one of VERIFIERS

    @property
    def learned(self) -> bool:
        """The learned verifier decides (else the rules veto, or nothing checks)."""
        return self.verify and self.verifier == "learned"
