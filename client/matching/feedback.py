"""What a served match and its rejection teach, recorded in one place for every source
that matches by meaning (the pack's similar and exact answers, the cache's hits).

Every served match is a weakly positive labelled pair; "wrong answer" turns it negative,
once per hit (a second rejection of the same hit changes nothing), and re-tunes tau by
F0.5. A rejection whose fault was the conversation (the same question served in another
context) is kept too, but teaches neither tau nor FL (``labels.context_record``). Those
pairs are what federated learning trains on (``client/device_caches.py: device_pairs``).
Learning from use that outgrows the pairs and tau belongs here.
"""

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from meancache.client.matching import labels
from meancache.client.matching.labels import PairStore
from meancache.client.matching.origins import Matched
from meancache.client.matching.question import embed_texts
from meancache.client.matching.settings import MatchSettings
from meancache.shared.encoder import Encoder
from meancache.shared.threshold import best_threshold, nearest_threshold

# How a pair is written: (hit id, record). The cache writes it with the entry's hit.
WritePair = Callable[[str, dict[str, Any]], None]
IN_ANOTHER_CONTEXT = ("the same question in another conversation: the entry now answers "
                      "only after the question it was first asked after")


@dataclass(frozen=True)
class ThresholdChange:
    """The outcome of a re-tune: ``old == new`` when nothing changed, and ``reason`` says why."""

    old: float
    new: float
    positives: int
    negatives: int
    reason: str

    @property
    def changed(self) -> bool:
        return self.old != self.new

    def __str__(self) -> str:
        if self.changed:
            return f"threshold {self.old:.3f} -> {self.new:.3f} ({self.reason})"
        return f"threshold stays {self.old:.3f} ({self.reason})"


class Thresholds(Protocol):
    """Where tau is kept (the cache's ``ThresholdState``): read by every decision, set by
    a re-tune on feedback."""

    @property
    def current(self) -> float: ...

    def set_local(self, value: float) -> None: ...


class Judge(Protocol):
    """What a re-tune reads of the matcher: its space, tau and settings."""

    encoder: Encoder
    settings: MatchSettings
    thresholds: Thresholds

    @property
    def tau(self) -> float: ...


class Feedback:
    def __init__(self, judge: Judge, store: PairStore) -> None:
        self._judge = judge
        self._store = store
        self._lock = threading.Lock()  # a rejection is checked and recorded at once

    def served(self, question: str, origin: Matched, write: WritePair | None = None
               ) -> None:
        """A match was served: a weakly positive pair until the user rejects it.
        ``write``: how the pair is stored when the source records it with its own state
        in one write (the cache's hit); the pair store's ``put_pair`` otherwise."""
        (write or self._store.put_pair)(origin.hit_id, self._pair(question, origin, 1))

    def already_rejected(self, origin: Matched) -> bool:
        record = self._store.get_pair(origin.hit_id)
        return record is not None and record.get("label") == 0

    def rejected(self, question: str, origin: Matched, *, in_another_context: bool = False
                 ) -> ThresholdChange:
        """The user says the match was wrong: a negative pair, then tau re-tuned. Once per
        hit: rejecting it again (say after the fresh answer failed) records nothing.
        ``in_another_context``: the fault was the context, not the match: the pair is
        kept out of what tunes tau and trains FL, and tau stays."""
        with self._lock:
            if self.already_rejected(origin):
                return self._unchanged("this answer's rejection was recorded before")
            pair = self._pair(question, origin, 0)
            self._store.put_pair(origin.hit_id, labels.context_record(pair)
                                 if in_another_context else pair)
            self._store.add_to_counter("rejections")
        if in_another_context:
            return self._unchanged(IN_ANOTHER_CONTEXT)
        return self.retune()

    def _pair(self, question: str, origin: Matched, label: int) -> dict[str, object]:
        return labels.record(question, origin.matched_query, origin.similarity,
                             origin.feedback_key, label, time.time())

    def _unchanged(self, reason: str) -> ThresholdChange:
        pairs = [p.label for p in labels.labelled_pairs(self._store)]
        tau = self._judge.tau
        return ThresholdChange(tau, tau, sum(pairs), len(pairs) - sum(pairs), reason)

    def retune(self, max_pairs: int = 2000) -> ThresholdChange:
        """Maximise F0.5 over the labelled pairs, re-scored in the current space."""
        judge = self._judge
        pairs = labels.labelled_pairs(self._store, newest=max_pairs)
        found = np.array([p.label for p in pairs], dtype=int)
        positives, negatives = int(found.sum()), int(len(found) - found.sum())
        old = judge.tau
        need = judge.settings.tune_min_per_class
        if positives < need or negatives < need:
            return ThresholdChange(
                old, old, positives, negatives,
                f"needs {need} accepted and {need} rejected hits to re-tune; "
                f"has {positives} and {negatives}",
            )
        encoder = judge.encoder
        a = embed_texts(encoder, [p.q1 for p in pairs])
        b = embed_texts(encoder, [p.q2 for p in pairs])
        best = best_threshold((a * b).sum(1), found)
        new = round(nearest_threshold(best.threshold), 4)
        judge.thresholds.set_local(new)
        return ThresholdChange(old, new, positives, negatives,
                               f"F0.5 {best.f05:.3f} on {len(pairs)} labelled pairs")
