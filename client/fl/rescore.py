"""How a device scores labels with a global model's judge that scored none of them (the
evidence round: fl_server.evidence_round; a simulated device's validation pairs): the
judge the round names (``ROUND_JUDGE``) is the learned decision's score over the global
verifier where the device's decision card fits it (shared.verifier.decision.judge_for),
else the verifier's probability.

Each label is scored as the device weighed it (client.device_caches.Asked): the global
verifier's probability of every stored question weighed, and where it would pick another
than the label's, the label is left out (it says nothing of that one's answer); the
decision's score then weighs the pick against its rivals with the cosines of the time,
as a lookup does (client.matching.matcher). A label that kept no rivals is a pair
scored alone, its cosine the global encoder's.
"""

from collections.abc import Callable

import numpy as np
from meancache.client.device_caches import Asked, Rescore
from meancache.client.matching import matcher
from meancache.shared.errors import VerifierError
from meancache.shared.pairs import Pair
from meancache.shared.verifier.decision import DECISION_JUDGE, features

Probabilities = Callable[[list[Pair]], np.ndarray]  # the global verifier's, pair by pair
Cosines = Callable[[list[Pair]], np.ndarray]  # the global encoder's, pair by pair


def rescorer(judge: str, probabilities: Probabilities, cosines: Cosines, recall_tau: float,
             verifier_threshold: float) -> Rescore | None:
    """The ``Rescore`` of the round's ``judge``: the decision's score where it names this
    device's decision card, the verifier's probability where it names none; None where it
    names a card this device does not hold (it cannot score for it: nothing is sent)."""
    if not judge.startswith(DECISION_JUDGE):
        return lambda asked: _picked(asked, probabilities)[0]
    try:
        decision = matcher.learned_decision()  # the card the device's lookups decide with
    except VerifierError:
        return None
    if judge.split(" over ")[0] != decision.judge:
        return None

    def score(asked: list[Asked]) -> np.ndarray:
        picked, each = _picked(asked, probabilities)
        alone = [i for i, a in enumerate(asked) if not a.cosines]
        found = cosines([Pair(asked[i].question, asked[i].stored[0], 1) for i in alone]) \
            if alone else []
        weighed = [a.cosines for a in asked]
        for i, cosine in zip(alone, found, strict=True):
            weighed[i] = [float(cosine)]
        return np.array([np.nan if np.isnan(p) else decision.score(features(
            weighed[i], each[i], recall_tau, verifier_threshold))
            for i, p in enumerate(picked)])

    return score


def _picked(asked: list[Asked], probabilities: Probabilities
            ) -> tuple[np.ndarray, list[np.ndarray]]:
    """Each label's pick's probability (NaN where another stored question is more
    probable) and the probabilities of all it weighed."""
    pairs = [Pair(a.question, stored, 1) for a in asked for stored in a.stored]
    flat = probabilities(pairs) if pairs else np.zeros(0)
    each = np.split(np.asarray(flat, dtype=float),
                    np.cumsum([len(a.stored) for a in asked])[:-1]) if asked else []
    picked = np.array([p[a.pick] if int(np.argmax(p)) == a.pick else np.nan
                       for a, p in zip(asked, each, strict=True)])
    return picked, each
