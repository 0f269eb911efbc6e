"""`meancache eval replay`: a semantic-cache benchmark in one command. Every ``q1`` is
stored with an answer of its own in a fresh cache, then every ``q2`` is asked: the
answer served is right if it is its own ``q1``'s and the pair is labelled the same
question, wrong if any other answer is served, a miss if none is."""

from dataclasses import asdict, dataclass

from meancache.client.cache import Hit, SemanticCache
from meancache.shared.pairs import Pair
from meancache.shared.progress import Progress
from meancache.shared.query import normalise_query


@dataclass(frozen=True)
class ReplayReport:
    stored: int
    right: int
    wrong: int
    miss: int

    @property
    def hit_precision(self) -> float:
        served = self.right + self.wrong
        return self.right / served if served else 0.0

    @property
    def hit_rate(self) -> float:
        asked = self.right + self.wrong + self.miss
        return (self.right + self.wrong) / asked if asked else 0.0

    def as_dict(self) -> dict[str, float | int]:
        return asdict(self) | {"hit_precision": self.hit_precision,
                               "hit_rate": self.hit_rate}


def replay(cache: SemanticCache, pairs: list[Pair], progress: Progress | None = None
           ) -> ReplayReport:
    """Store, then ask; ``cache`` should start empty (its answers are replaced)."""
    answers: dict[str, str] = {}
    for number, pair in enumerate(pairs, 1):
        key = normalise_query(pair.q1)
        if key not in answers:
            answers[key] = f"answer #{len(answers)} (to: {pair.q1})"
            cache.insert(pair.q1, answers[key])
        if progress is not None:
            progress(number, 2 * len(pairs))
    right = wrong = miss = 0
    for number, pair in enumerate(pairs, 1):
        result = cache.lookup(pair.q2)
        if not isinstance(result, Hit):
            miss += 1
        elif pair.label == 1 and result.answer == answers[normalise_query(pair.q1)]:
            right += 1
        else:
            wrong += 1
        if progress is not None:
            progress(len(pairs) + number, 2 * len(pairs))
    return ReplayReport(len(answers), right, wrong, miss)
