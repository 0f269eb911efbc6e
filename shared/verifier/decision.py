"""The learned decision (``settings.decision == "learned"``): whether the verifier's pick
among a question's counting candidates is served, from what is known at lookup.

The rules it replaces (serve the most probable candidate if its probability reaches the
card's threshold and no other candidate's does: ``matcher.ambiguous``) decline wherever two
stored questions both look right, which on data with many near neighbours is most of the
time, while the verifier's pick is often right there. A logistic model over the
candidates' cosines, their probabilities, the gap between the first two and the pick's
rank serves where the pick clearly dominates and declines where it does not
(benchmarks/decision_study.py fits it on the choose splits of three domains and reports
the test splits; docs/verification.md). Fitted on the default encoder's (MPNet) cosines
and the shipped verifier's probabilities, with each coefficient's sign bounded where its
direction is known before the data (``SIGNS``).

Its card (``decision.json``) is package data: the features in order, their coefficients,
the intercept, the score from which a pick is served, the verifier it was fitted on and
the sha256 of the data it was fitted on, and the encoder whose cosines it weighs (its
name and ``Encoder.model_version``: the sha256 prefix over the packaged model's weight and
config files, ``encoder/fingerprint.py``; not the PCA layer, which each cache fits on its
own questions, nor FL global weights over the model, which fine-tune its top layers: the
card was fitted on the base model's full-space cosines, which both only move); the card
names the sha256 of its own content and is refused (``VerifierError``) if that or any
field is wrong. With another verifier or another encoder model the matcher leaves the
decision to the rules. Light: numpy only.

The card's score is also the judge of the error bound (client/learning/bound.py) where the
card decides: the bound learns the score from which a pick is served, starting from the
card's threshold. The card carries its own evidence for that (``evidence``: its choose
splits' picks, each a label at its score, right or wrong, binned as federated learning
pools labels: shared.fl.bound_evidence), which a device tests with its own labels and
the pool, so that its first answers are backed by labels, not by the threshold alone.
Its judge's name is the card's sha256 (``judge``), which names the verifier and the
encoder too; the FL server names it the same way for the rounds it runs with this
verifier and encoder (``judge_for``). Over a federated fine-tune of its verifier the card
still decides (the rounds move the verifier's probabilities, they do not replace them),
as another judge (``judge_of``): its evidence, scored by the base verifier, backs
nothing there, and the threshold it backs is only that judge's prior.
"""

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from meancache.shared.errors import VerifierError
from meancache.shared.fl.bound_evidence import BoundEvidence

CARD_PATH = Path(__file__).parent / "decision.json"
# Probabilities are read as logits clipped here: a lone candidate's missing runner-up
# (probability 0) reads as a clear gap, not an infinite one.
_CLIP = 1e-4
FEATURES = (
    "logit_p1",            # the pick's probability, as a logit
    "logit_gap",           # the pick's logit less the runner-up's (none: probability 0)
    "p2",                  # the runner-up's probability (none: 0)
    "cos_pick",            # the pick's cosine
    "cos_nearest_gap",     # the nearest candidate's cosine less the pick's (0 if the same)
    "cos_margin",          # the nearest's cosine less the second's (none: the recall tau)
    "pick_is_nearest",     # 1 if the pick is the most similar candidate
    "count",               # counting candidates scored
    "count_over",          # of them, those at or over the verifier's threshold
)
# The direction each feature's coefficient must have, where it is defensible before any
# data is seen (+1: not negative, -1: not positive, 0: free); benchmarks/decision_study.py
# fits within them. Unconstrained, the features' collinearity let a fit weigh the pick's
# cosine against it (-2.4): the closer a doubtful pick, the likelier it was declined.
SIGNS = {
    "logit_p1": +1,         # the verifier's confidence in the pick
    "logit_gap": +1,        # the pick dominates the runner-up
    "p2": -1,               # a likely runner-up makes which stored answer is meant a guess
    "cos_pick": +1,         # a closer pick is likelier the same question
    "cos_nearest_gap": -1,  # the embedding prefers another candidate to the pick
    "cos_margin": +1,       # the nearest's lead: the pick's, if it is the nearest; if not,
                            # cos_nearest_gap weighs against it. For a lone pick it is its
                            # cosine less the recall tau: left free, the fit put the pick's
                            # cosine against it there (-4.5, benchmarks/decision_study.py)
    "pick_is_nearest": +1,  # the embedding and the verifier agree
    "count": 0,             # a dense neighbourhood: more near-misses, but more duplicates
    "count_over": 0,        # the pick itself counts here when it passes the threshold
}
# The hand-made parts a card may keep beside the model (each kept only where the model
# measurably lost without it on the choose splits): the verifier's threshold as a floor
# on the pick's probability, the ambiguity rule (``matcher.ambiguous``), the rule checks
# kept beside the verifier (``rules.WITH_LEARNED``).
KEEPS = ("floor", "ambiguity rule", "kept rules")
_FIELDS = ("features", "coefficients", "intercept", "threshold", "keeps", "verifier_sha256",
           "encoder", "encoder_version", "data_sha256", "evidence", "command", "sha256")
DECISION_JUDGE = "decision"  # a judge's name: this word, then the card's sha256


def _logit(p: float) -> float:
    p = min(max(p, _CLIP), 1.0 - _CLIP)
    return math.log(p / (1.0 - p))


def features(cosines: Sequence[float], probabilities: Sequence[float], recall_tau: float,
             verifier_threshold: float) -> np.ndarray:
    """The decision's inputs for counting candidates (most similar first): ``cosines``
    and the verifier's ``probabilities`` of each, in ``FEATURES`` order."""
    if not len(cosines) or len(cosines) != len(probabilities):
        raise ValueError(f"{len(cosines)} cosines for {len(probabilities)} probabilities")
    p = np.asarray(probabilities, dtype=np.float64)
    top = int(np.argmax(p))
    ranked = np.sort(p)[::-1]
    p1, p2 = float(ranked[0]), float(ranked[1]) if len(p) > 1 else 0.0
    c2 = float(cosines[1]) if len(cosines) > 1 else recall_tau
    return np.array([
        _logit(p1), _logit(p1) - _logit(p2), p2, float(cosines[top]),
        float(cosines[0]) - float(cosines[top]), float(cosines[0]) - c2,
        float(top == 0), float(len(p)), float((p >= verifier_threshold).sum()),
    ])


def card_digest(card: dict) -> str:
    """The sha256 of a card's content (every field but ``sha256``, canonical JSON)."""
    body = {k: v for k, v in card.items() if k != "sha256"}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class LearnedDecision:
    """A fitted card: ``serves`` says whether a pick is served."""

    coefficients: np.ndarray
    intercept: float
    threshold: float
    keeps: frozenset[str]
    verifier_sha256: str
    encoder: str  # the encoder's name, for messages
    encoder_version: str  # ``Encoder.model_version`` of the encoder it was fitted on
    sha256: str  # the card's
    evidence: BoundEvidence  # its choose splits' picks as labels of its score (``judge``)

    @property
    def judge(self) -> str:
        """The name of this card's score as the bound's judge: its sha256, which covers
        the coefficients, the verifier and the encoder (a score means something only to
        the card that gave it)."""
        return f"{DECISION_JUDGE} {self.sha256}"

    def fits(self, verifier_sha256: str, encoder_version: str, base: str = "") -> bool:
        """Whether this card decides for that verifier (its file's sha256) and encoder
        (``Encoder.model_version``): the ones it was fitted on, or a federated fine-tune
        of that verifier (``base``: the int8 verifier its global tensors apply over,
        client.verifier), whose probabilities the rounds move, not replace."""
        return encoder_version == self.encoder_version \
            and self.verifier_sha256 in (verifier_sha256, base)

    def judge_of(self, verifier_judge: str, base: str = "") -> str:
        """The name of this card's score with a verifier it ``fits``: its own judge over
        the verifier it was fitted on, another over a federated fine-tune of it (named by
        the fine-tune's ``verifier_judge``, the global model's sha256), whose scores the
        card's evidence, its base's, does not hold."""
        return f"{self.judge} over {verifier_judge}" if base else self.judge

    @classmethod
    def from_card(cls, card: object, where: str = "the decision card") -> "LearnedDecision":
        """The card's decision, or ``VerifierError`` naming what is wrong with it."""
        if not isinstance(card, dict) or set(card) != set(_FIELDS):
            keys = sorted(card) if isinstance(card, dict) else type(card).__name__
            raise VerifierError(f"{where} must have exactly the fields {list(_FIELDS)}, "
                                f"not {keys}")
        if card["sha256"] != card_digest(card):
            raise VerifierError(f"{where}'s content does not match its sha256: it was "
                                "changed or damaged; it is not used")
        if tuple(card["features"]) != FEATURES:
            raise VerifierError(f"{where} names the features {card['features']}, not the "
                                f"{list(FEATURES)} this version computes")
        try:
            coefficients = np.array([float(c) for c in card["coefficients"]])
            numbers = [float(card[k]) for k in ("intercept", "threshold")]
        except (TypeError, ValueError) as exc:
            raise VerifierError(f"{where} has a field that is not a number ({exc})") from None
        if len(coefficients) != len(FEATURES) or not np.isfinite(coefficients).all() \
                or not all(math.isfinite(n) for n in numbers) or not 0 < numbers[1] < 1:
            raise VerifierError(f"{where} needs {len(FEATURES)} finite coefficients and a "
                                "threshold between 0 and 1")
        keeps = card["keeps"]
        if not isinstance(keeps, list) or not set(keeps) <= set(KEEPS):
            raise VerifierError(f"{where} keeps {keeps!r}; it may keep only some of "
                                f"{list(KEEPS)}")
        try:
            evidence = BoundEvidence.from_record(card["evidence"])
        except ValueError as exc:
            raise VerifierError(f"{where}'s evidence is not bound evidence ({exc})") from None
        decision = cls(coefficients, numbers[0], numbers[1], frozenset(keeps),
                       str(card["verifier_sha256"]), str(card["encoder"]),
                       str(card["encoder_version"]), str(card["sha256"]), evidence)
        return replace(decision, evidence=evidence.judged_by(decision.judge))

    @classmethod
    def load(cls, path: Path = CARD_PATH) -> "LearnedDecision":
        try:
            card = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise VerifierError(f"the decision card {path} is missing or unreadable ({exc}); "
                                "reinstall meancache") from None
        return cls.from_card(card, f"the decision card {path}")

    def score(self, x: np.ndarray) -> float:
        """The probability that serving the pick is right."""
        z = float(self.coefficients @ x) + self.intercept
        return 1.0 / (1.0 + math.exp(-min(max(z, -50.0), 50.0)))

    def serves(self, cosines: Sequence[float], probabilities: Sequence[float],
               recall_tau: float, verifier_threshold: float) -> tuple[bool, float]:
        """(whether the verifier's pick is served at the card's threshold, its score)."""
        score = self.score(features(cosines, probabilities, recall_tau, verifier_threshold))
        return score >= self.threshold, score


def judge_for(verifier_judge: str, encoder_version: str, base: str = "",
              card_path: Path = CARD_PATH) -> str:
    """Whose scores a device's error-bound labels hold when it runs that verifier (named by
    its card's ``judge``: its file's sha256, or for a federated fine-tune of ``base`` the
    global model's) with that encoder and the default decision: the shipped card's score
    where the card fits them (``judge_of``), else the verifier's own probability (also
    where the card cannot be read: the device then cannot use it either)."""
    try:
        decision = LearnedDecision.load(card_path)
    except VerifierError:
        return verifier_judge
    return decision.judge_of(verifier_judge, base) \
        if decision.fits(verifier_judge, encoder_version, base) else verifier_judge
