"""`meancache eval replay --learn`: a stream of questions as a user meets them, answered
by the cache that learns its bound as it goes, beside the static decision on the same
stream.

Each question belongs to a group (questions labelled the same question); the simulated
upstream answers a group with one answer of its own, so whether a served answer is right
is known. A miss is answered upstream and stored; when it had a candidate, the fresh
answer is compared with the candidate's (exactly: the simulation knows; the encoder's
comparison, ``agreement``, is measured apart) and the pair labelled; a
would-be hit near the threshold is explored (``explore``). The learned decision: an
alias or the very same question answers at once; otherwise the judge's score of the best
candidate (the learned verifier's probability, the cosine without it) must reach the
bound's threshold for that entry (``state.Learned``).
"""

import random
import tempfile
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from meancache.client.cache import Hit, SemanticCache
from meancache.client.cache.settings import CacheSettings
from meancache.client.cache.store import EntryStore
from meancache.client.learning.awaiting import Awaiting, Pending
from meancache.client.learning.bound import CONFIDENCE, Label
from meancache.client.learning.explore import Exploration
from meancache.client.learning.state import Learned
from meancache.client.matching.matcher import VERIFIED_AT_MOST, Verifier, ambiguous
from meancache.client.matching.question import embed_texts
from meancache.client.matching.rules import WITH_LEARNED, verify
from meancache.shared.encoder import Encoder
from meancache.shared.pairs import Pair
from meancache.shared.progress import Progress
from meancache.shared.query import embedding_text, normalise_query

CACHE, UPSTREAM, EXPLORED = "cache", "upstream", "explored"


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
    """The simulated upstream's answer to every question of ``group``."""
    return f"The answer to question group number {group}, the same whoever asks it."


@dataclass
class Tally:
    """Right, wrong and miss over a stream, with the running series for the picture."""

    right: int = 0
    wrong: int = 0
    miss: int = 0
    answerable: int = 0  # questions whose group was answered before
    answerable_hits: int = 0
    upstream: int = 0  # calls to the upstream (misses and explorations)
    explored: int = 0
    outcomes: list[str] = field(default_factory=list)  # "right", "wrong", "miss" per turn

    def count(self, outcome: str, answerable: bool) -> None:
        setattr(self, outcome, getattr(self, outcome) + 1)
        self.outcomes.append(outcome)
        self.answerable += answerable
        self.answerable_hits += answerable and outcome != "miss"
        self.upstream += outcome == "miss"

    @staticmethod
    def summary(outcomes: Sequence[str]) -> dict[str, float]:
        right, wrong = outcomes.count("right"), outcomes.count("wrong")
        served, asked = right + wrong, len(outcomes)
        return {"right": right, "wrong": wrong, "miss": asked - served,
                "hit_precision": right / served if served else 0.0,
                "wrong_rate": wrong / served if served else 0.0,
                "hit_rate": served / asked if asked else 0.0}

    def report(self) -> dict[str, object]:
        half = len(self.outcomes) // 2
        return {"whole": self.summary(self.outcomes),
                "last_half": self.summary(self.outcomes[half:]),
                "answerable_hit_rate": self.answerable_hits / self.answerable
                if self.answerable else 0.0,
                "upstream_calls": self.upstream, "explored": self.explored}


def replay_static(cache: SemanticCache, turns: Sequence[Turn], progress: Progress | None = None
                  ) -> Tally:
    """The cache's own (static) decision on the stream: a miss is answered and stored."""
    tally, group_of, seen = Tally(), {}, set()
    for number, turn in enumerate(turns, 1):
        result = cache.lookup(turn.question)
        if isinstance(result, Hit):
            right = group_of.get(result.entry_id) == turn.group
            tally.count("right" if right else "wrong", turn.group in seen)
        else:
            tally.count("miss", turn.group in seen)
            group_of[cache.insert(turn.question, answer_of(turn.group)).id] = turn.group
        seen.add(turn.group)
        if progress is not None:
            progress(number, len(turns))
    return tally


@dataclass(frozen=True)
class LearnedRules:
    """What the learned decision keeps of today's rules (measured, not assumed)."""

    ambiguity: bool = False  # two candidates over the threshold make a miss
    word_rules: bool = False  # verification.WITH_LEARNED vetoes a hit


class LearningReplay:
    """The learned decision over a growing in-memory store of questions and answers, its
    learning kept in a real store (``Learned``)."""

    def __init__(self, encoder: Encoder, verifier: Verifier | None, settings: CacheSettings,
                 learning: Learned, exploration: Exploration, rules: LearnedRules,
                 seed: int) -> None:
        self.encoder, self.verifier, self.settings = encoder, verifier, settings
        self.learning, self.rules = learning, rules
        self.awaiting = Awaiting(learning, exploration, random.Random(seed))
        self.questions: list[str] = []
        self.answers: list[str] = []
        self.keys: dict[str, int] = {}
        self.vectors = np.zeros((0, encoder.dim), dtype=np.float32)
        # candidates start where the shipped decision's do (the recall tau)
        self.floor = settings.global_threshold - (settings.recall_margin
                                                  if verifier is not None else 0.0)

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        return embed_texts(self.encoder, texts)

    def judge(self, question: str, vector: np.ndarray) -> tuple[int, float, bool] | None:
        """(best candidate, its score, whether a rule refuses it), or None without one."""
        if not self.questions:
            return None
        similarities = self.vectors @ vector
        order = np.argsort(-similarities)[:min(self.settings.candidates, VERIFIED_AT_MOST)]
        order = [int(i) for i in order if similarities[i] >= self.floor]
        if not order:
            return None
        if self.verifier is None:
            best, score = order[0], float(similarities[order[0]])
            return best, score, False
        probabilities = self.verifier.probabilities(question, [self.questions[i] for i in order])
        top = int(np.argmax(probabilities))
        best, score = order[top], float(probabilities[top])
        threshold = self.learning.threshold(str(best))
        refused = (self.rules.ambiguity and ambiguous(probabilities, threshold)) or \
            (self.rules.word_rules and verify(question, self.questions[best],
                                              WITH_LEARNED) is not None)
        return best, score, refused

    def store(self, question: str, answer: str, vector: np.ndarray) -> None:
        self.keys.setdefault(embedding_text(question), len(self.questions))
        self.questions.append(question)
        self.answers.append(answer)
        self.vectors = np.vstack([self.vectors, vector[None].astype(np.float32)])

    def ask(self, turn: Turn, upstream: dict[int, str]) -> tuple[str, str]:
        """(the answer shown, where it came from: CACHE, UPSTREAM or EXPLORED);
        ``upstream`` answers by group."""
        alias = self.learning.alias(turn.question)
        same = self.keys.get(embedding_text(turn.question))
        if alias is not None or same is not None:
            return self.answers[int(alias) if alias is not None else same], CACHE
        vector = self.embed([turn.question])[0]
        judged = self.judge(turn.question, vector)
        fresh = upstream[turn.group]
        if judged is not None:
            best, score, refused = judged
            threshold = self.learning.threshold(str(best))
            if score >= threshold and not refused:
                explored = self.awaiting.explores(str(best), score)
                if explored is None:
                    return self.answers[best], CACHE
                self._label(turn.question, explored, fresh)
                return fresh, EXPLORED
            self._label(turn.question, Pending(str(best), score), fresh)
        self.store(turn.question, fresh, vector)
        return fresh, UPSTREAM

    def _label(self, question: str, pending: Pending, fresh: str) -> None:
        wrong = fresh != self.answers[int(pending.entry_id)]  # the simulated answers say it
        self.learning.learn(Label(pending.score, wrong, pending.labelled_with,
                                  pending.entry_id, pending.source), question)


def replay_learning(replayer: LearningReplay, turns: Sequence[Turn],
                    progress: Progress | None = None) -> Tally:
    tally, seen = Tally(), set()
    for number, turn in enumerate(turns, 1):
        answer, source = replayer.ask(turn, {turn.group: answer_of(turn.group)})
        if source == CACHE:
            tally.count("right" if answer == answer_of(turn.group) else "wrong",
                        turn.group in seen)
        else:
            tally.count("miss", turn.group in seen)
            tally.explored += source == EXPLORED
        seen.add(turn.group)
        if progress is not None:
            progress(number, len(turns))
    return tally


def learned_replay(encoder: Encoder, verifier: Verifier | None, settings: CacheSettings,
                   turns: Sequence[Turn], max_wrong_rate: float, prior: float,
                   exploration: Exploration, rules: LearnedRules, seed: int,
                   directory: Path | None = None, progress: Progress | None = None
                   ) -> tuple[Tally, Learned]:
    """The learned decision on ``turns``, its learning kept in ``directory`` (a fresh
    temporary store if None)."""
    with tempfile.TemporaryDirectory(prefix="meancache-learn-") as scratch, \
            closing(EntryStore(Path(directory or scratch))) as store:
        learning = Learned(store, max_wrong_rate, prior, CONFIDENCE)
        replayer = LearningReplay(encoder, verifier, settings, learning, exploration, rules,
                                  seed)
        return replay_learning(replayer, turns, progress), learning
