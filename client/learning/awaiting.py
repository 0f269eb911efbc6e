"""The candidates awaiting the upstream's answer: a declined candidate, or a would-be hit
sent upstream by exploration, is remembered per question until the upstream answers it;
the two answers then agree or not, and that is a label for the bound (and an alias when
they agree). This module alone holds them; nothing here is stored: a candidate whose
answer never comes (the app closed first) is simply never labelled.
"""

import random
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

from meancache.client.learning.bound import Label, OwnLabels, Weighed
from meancache.client.learning.explore import Exploration
from meancache.client.learning.state import Learned

KEPT = 64  # questions remembered at most (the oldest is dropped first)


@dataclass(frozen=True)
class Pending:
    """A candidate waiting for the upstream's answer to the question to label it: declined
    (``labelled_with`` 1: every declined candidate is compared) or explored (the
    exploration rate: the chance that this would-be hit was checked)."""

    entry_id: str
    score: float
    labelled_with: float = 1.0
    source: str = "miss"
    weighed: Weighed = ()  # what the judge weighed
    why: str = ""  # why an explored one was (the warm-up says so; the user is shown it)


def warming_note(warmup: int, own: OwnLabels, max_wrong_rate: float) -> str:
    """Why a would-be hit was checked in the warm-up, as the user is told."""
    note = f"exploration: a new cache checks its first {warmup} matches"
    if own.labels < warmup:
        return f"{note}; {own.labels} checked so far"
    return (f"{note}, and more while over {max_wrong_rate:.1%} of them were wrong; "
            f"{own.labels} checked so far, {own.wrong} wrong")


class Awaiting:
    """What the cache's traffic still has to label. ``rng``: the draws of exploration;
    without one nothing is explored. ``learns`` False: nothing waits, so nothing is
    labelled (the static decision a replay compares with)."""

    def __init__(self, learned: Learned, exploration: Callable[[str], Exploration],
                 rng: random.Random | None, learns: bool = True) -> None:
        """``exploration``: how the judge of that name's scores are explored
        (``Exploration.for_judge`` with the settings)."""
        self.learned, self.exploration, self._rng = learned, exploration, rng
        self.learns = learns
        self._pending: OrderedDict[str, Pending] = OrderedDict()

    @property
    def warmup(self) -> int:
        """The warm-up in force for the judge now (0: none)."""
        return self.exploration(self.learned.judge).warmup_in_force(
            self._rng is not None and self.learns)

    def explores(self, entry_id: str, score: float,
                 weighed: Weighed = ()) -> Pending | None:
        """The would-be hit on ``entry_id`` at the judge's ``score`` as an exploration, if
        it is one: the draw at its chance (``Exploration.chance``) says so."""
        if self._rng is None or not self.learns:
            return None
        threshold = self.learned.threshold(entry_id)
        learned = self.learned.settled(threshold)
        exploration = self.exploration(self.learned.judge)
        own_over = self.learned.own_over(threshold) if exploration.warmup else None
        if not exploration.explores(score, threshold, self._rng, learned, own_over):
            return None
        why = warming_note(exploration.warmup, own_over, self.learned.max_wrong_rate) \
            if own_over is not None and exploration.warming(own_over) else "exploration"
        return Pending(entry_id, score, exploration.chance(score, threshold, learned, own_over),
                       "explore", weighed, why)

    def wait(self, question_key: str, pending: Pending) -> None:
        if not self.learns:
            return
        self._pending[question_key] = pending
        while len(self._pending) > KEPT:
            self._pending.popitem(last=False)

    def answered(self, question_key: str, question: str, answer: str,
                 cached_answer: Callable[[str], str | None],
                 agree: Callable[[str, str], bool]) -> Label | None:
        """The upstream's ``answer`` to a question whose candidate was waiting, as the
        label it makes (learned at once); None when nothing waited or the entry is gone
        (``cached_answer`` gives None)."""
        pending = self._pending.pop(question_key, None)
        if pending is None:
            return None
        cached = cached_answer(pending.entry_id)
        if cached is None:
            return None
        label = Label(pending.score, not agree(answer, cached), pending.labelled_with,
                      pending.entry_id, pending.source, weighed=pending.weighed)
        self.learned.learn(label, question)
        return label

    def clear(self) -> None:
        self._pending.clear()
