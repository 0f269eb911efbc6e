"""`meancache eval replay --learn`: a stream of questions as a user meets them, answered
by the cache that learns its bound as it goes, beside the static decision on the same
stream.

Each question belongs to a group (questions labelled the same question); the simulated
upstream answers a group with one short answer of its own, so whether a served answer is
right is known, and the cache's own comparison of answers (``learning.agreement``: exact
for short answers) labels a declined or explored candidate exactly. Both decisions are
the product's cache (``SemanticCache``: the configured decision, aliases, the bound,
exploration with a seeded draw); the static one is opened with ``learns=False``.
"""

import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from meancache.client.cache import Hit, SemanticCache
from meancache.shared.pairs import Pair
from meancache.shared.progress import Progress
from meancache.shared.query import normalise_query


@dataclass(frozen=True)
class Turn:
    question: str
    group: int


def stream_of(pairs: Sequence[Pair], seed: int) -> list[Turn]:
    """Every distinct question of ``pairs`` once, grouped by their label-1 pairs (union
    find), in an order drawn from ``seed``."""
    parent: dict[str, str] = {}

    def root(key: str) -> str:
        parent.setdefault(key, key)
        while parent[key] != key:
            parent[key] = parent[parent[key]]
            key = parent[key]
        return key

    text: dict[str, str] = {}
    for pair in pairs:
        for q in (pair.q1, pair.q2):
            text.setdefault(normalise_query(q), q)
            root(normalise_query(q))
        if pair.label == 1:
            parent[root(normalise_query(pair.q1))] = root(normalise_query(pair.q2))
    groups: dict[str, int] = {}
    turns = [Turn(q, groups.setdefault(root(key), len(groups))) for key, q in text.items()]
    random.Random(seed).shuffle(turns)
    return turns


def answer_of(group: int) -> str:
    """The simulated upstream's answer to every question of ``group``: short (at most
    ``agreement.SHORT_WORDS`` words), so the cache compares two of them exactly."""
    return f"Answer {group}."


@dataclass
class Tally:
    """Right, wrong and miss over a stream, with the running series for the picture."""

    right: int = 0
    wrong: int = 0
    miss: int = 0
    answerable_hits: int = 0  # hits among the questions whose group was answered before
    upstream: int = 0  # calls to the upstream (misses and explorations)
    explored: int = 0
    outcomes: list[str] = field(default_factory=list)  # "right", "wrong", "miss" per turn
    answerables: list[bool] = field(default_factory=list)  # group answered before, per turn

    def count(self, outcome: str, answerable: bool) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.outcomes.append(outcome)
        self.answerables.append(answerable)
        self.answerable_hits += answerable and outcome != "miss"
        self.upstream += outcome == "miss"

    @staticmethod
    def summary(outcomes: Sequence[str], answerables: Sequence[bool] = ()
                ) -> dict[str, float]:
        """Counts and rates of ``outcomes``; with ``answerables`` also the ``ceiling``: the
        share of questions whose group was answered before, the most any cache can serve
        right (a group's first question can only miss)."""
        right, wrong = outcomes.count("right"), outcomes.count("wrong")
        served, asked = right + wrong, len(outcomes)
        summary = {"right": right, "wrong": wrong, "miss": asked - served,
                   "hit_precision": right / served if served else 0.0,
                   "wrong_rate": wrong / served if served else 0.0,
                   "hit_rate": served / asked if asked else 0.0}
        if answerables:
            summary["ceiling"] = sum(answerables) / len(answerables)
        return summary

    def report(self) -> dict[str, object]:
        half = len(self.outcomes) // 2
        return {"whole": self.summary(self.outcomes, self.answerables),
                "last_half": self.summary(self.outcomes[half:], self.answerables[half:]),
                "answerable_hit_rate": self.answerable_hits / sum(self.answerables)
                if any(self.answerables) else 0.0,
                "upstream_calls": self.upstream, "explored": self.explored}


def replay(cache: SemanticCache, turns: Sequence[Turn], progress: Progress | None = None
           ) -> Tally:
    """The stream as a user meets it: a hit is right when its entry answers the question's
    group; a miss (explored or not) is answered by the simulated upstream and stored, which
    labels the candidate that waited for that answer (``SemanticCache.insert``). The cache
    learns as it goes unless it was opened with ``learns=False`` (the static decision)."""
    tally, group_of, seen = Tally(), {}, set()
    for number, turn in enumerate(turns, 1):
        result = cache.lookup(turn.question)
        if isinstance(result, Hit):
            right = group_of.get(result.entry_id) == turn.group
            tally.count("right" if right else "wrong", turn.group in seen)
        else:
            tally.count("miss", turn.group in seen)
            tally.explored += result.explored
            group_of[cache.insert(turn.question, answer_of(turn.group)).id] = turn.group
        seen.add(turn.group)
        if progress is not None:
            progress(number, len(turns))
    return tally
