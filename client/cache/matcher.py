"""The one decision of "this stored question answers that one", for every answer source
that matches by meaning (the instruction pack's similar match and the semantic cache),
and the one path of feedback on such a match.

The ``Matcher`` holds what the decision needs: the encoder (the vector space, switched
only by the cache that owns it), tau (``ThresholdState``) and the per-entry thresholds,
the verifier, the candidate count, and a memo of the last questions' vectors (the pack
and then the cache embed the current question once). The rule, the same for every
source:

- every question is embedded as ``shared.query.embedding_text`` makes it (normalised:
  "Summarise." and "summarise" are one question, and one vector);
- a source offers its best candidates (at most ``candidates``, similarity >= ``floor``,
  best first), having dropped those it may not serve (another context, rejected before);
- a candidate counts when its similarity reaches its threshold: tau (with the learned
  verifier, the recall tau: tau less ``settings.recall_margin``), or the entry's own one
  relative to it where the entry has feedback evidence (``entry_threshold``);
- a question past the encoder's window matches only the very same question (its
  embedding sees only the beginning);
- the verifier (``settings.verifier``), with ``settings.verify_hits`` on, decides; a veto is a
  miss, never a reason to serve a lower candidate:
  - "learned" (the default; ``shared.verifier``) scores up to ``VERIFIED_AT_MOST``
    counting candidates, each pair alone; the most probable is served if its
    probability reaches the verifier's threshold, no other candidate's does too
    (``ambiguous``), and the rule checks kept beside it (``verification.WITH_LEARNED``: a
    swapped direction, an opposite word) do not veto it (the very same question passes by
    identity). It is loaded only when this is chosen;
  - "rules" (``verification.verify``, every check) looks at the best counting candidate
    only and vetoes it when the two differ in a negation, number, name, ...

Feedback: every served match is a weakly positive labelled pair; "wrong answer" turns it
negative, once per hit (a second rejection of the same hit changes nothing), and re-tunes
tau by F0.5. Those pairs are what federated learning trains on (``feedback.device_pairs``).
"""

import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from typing import Protocol

import numpy as np
from meancache.client.cache import entry_threshold, feedback
from meancache.client.cache.results import ThresholdChange
from meancache.client.cache.settings import CacheSettings, MatchSettings
from meancache.client.cache.source import Matched
from meancache.client.cache.store import EntryStore
from meancache.client.cache.summary import DECLINED
from meancache.client.cache.threshold import ThresholdState
from meancache.client.cache.verification import CHECKS, WITH_LEARNED, verify
from meancache.shared.encoder import Encoder
from meancache.shared.progress import Progress
from meancache.shared.query import embedding_text
from meancache.shared.threshold import best_threshold, nearest_threshold
from meancache.shared.verifier.runtime import LearnedVerifier

log = logging.getLogger(__name__)

MEMO_SIZE = 64  # question vectors remembered (a follow-up's context was the last question)
NOTHING_CLOSE = "no cached query is similar enough"
VERIFIED_AT_MOST = 5  # counting candidates the verifier scores (most similar first)


class Verifier(Protocol):
    """The learned verifier (``settings.verifier == "learned"``): how likely each
    candidate asks the same as the query (each pair scored alone), and the probability from
    which that counts; ``shared.verifier.LearnedVerifier``."""

    threshold: float

    def probabilities(self, query: str, candidates: Sequence[str]) -> np.ndarray: ...


def ambiguous(probabilities: np.ndarray, threshold: float) -> bool:
    """More than one candidate reaches the verifier's threshold: which stored answer is
    meant is a guess, so the decision is a miss. Each candidate scored is one more chance
    to pass a wrong one; asking that the pick be the only one that passes adds no knob (on
    the replay of QQP dev-a duplicates, hit precision 89.8% -> 95.1%; single pairs are
    unchanged; docs/verification.md)."""
    return int((np.asarray(probabilities) >= threshold).sum()) > 1


@lru_cache(maxsize=1)
def shipped_verifier() -> LearnedVerifier:
    """The verifier that ships with meancache, loaded (and hash-checked) once."""
    return LearnedVerifier.load()


@dataclass(frozen=True)
class Question:
    """A question as every source compares it."""

    text: str  # cleaned (``clean_query``): what the verifier reads
    key: str  # normalised: what is embedded, and "the same question"
    vector: np.ndarray
    truncated: bool  # past the encoder's window


@dataclass(frozen=True)
class Candidate:
    """A stored question a source offers, with what its threshold depends on."""

    key: str  # the source's own id (a cache entry id, a pack instruction)
    text: str  # the stored question
    similarity: float
    evidence: entry_threshold.Evidence | None = None  # None: held to tau


@dataclass(frozen=True)
class Match:
    candidate: Candidate
    probability: float | None = None  # the verifier's; None without verification


@dataclass(frozen=True)
class NoMatch:
    reason: str
    best_similarity: float | None = None
    # A near match the verifier declined: the reason without its detail (the question's
    # words, a probability), which is what declines are counted by. None: not a veto.
    veto_kind: str | None = None

    @property
    def vetoed(self) -> bool:
        return self.veto_kind is not None


def embed_texts(encoder: Encoder, texts: Sequence[str], progress: Progress | None = None
                ) -> np.ndarray:
    """Questions embedded as every match embeds them (``embedding_text``)."""
    return encoder.encode([embedding_text(t) for t in texts], progress=progress)


class Matcher:
    def __init__(self, encoder: Encoder, thresholds: ThresholdState, store: EntryStore,
                 settings: MatchSettings | None = None, verifier: Verifier | None = None
                 ) -> None:
        """``verifier``: the learned one, used only when the settings choose it; the
        shipped one by default, loaded on the first decision that needs it."""
        self.encoder = encoder  # the cache's current vector space (see SemanticCache)
        self.thresholds = thresholds
        self.settings = settings or CacheSettings().matching
        self._verifier = verifier
        self._store = store  # where the labelled pairs live
        self._lock = threading.Lock()  # the memo
        self._feedback = threading.Lock()  # a rejection is checked and recorded at once
        self._memo: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()

    # the question -------------------------------------------------------------------
    @property
    def tau(self) -> float:
        return self.thresholds.current

    @property
    def verifier(self) -> Verifier:
        if self._verifier is None:
            self._verifier = shipped_verifier()
        return self._verifier

    @property
    def recall_tau(self) -> float:
        """Where candidates start: under tau by ``recall_margin`` when the learned verifier
        checks them (it, not the similarity, decides), tau itself otherwise."""
        margin = self.settings.recall_margin if self.settings.learned else 0.0
        return self.tau - margin

    @property
    def floor(self) -> float:
        """The lowest similarity a candidate may have: under the recall tau by what an
        entry's own threshold may relax."""
        tau = self.recall_tau
        return entry_threshold.floor(tau) if self.settings.entry_thresholds else tau

    def embed(self, text: str) -> np.ndarray:
        """``text`` in the current space, remembered for the lookups that follow."""
        encoder, key = self.encoder, embedding_text(text)
        with self._lock:
            vector = self._memo.get((encoder.version, key))
            if vector is not None:
                self._memo.move_to_end((encoder.version, key))
                return vector
        vector = encoder.encode([key])[0]
        with self._lock:
            self._memo[(encoder.version, key)] = vector
            if len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)
        return vector

    def question(self, text: str) -> Question:
        """``text`` (already cleaned) as sources compare it."""
        return Question(text, embedding_text(text), self.embed(text),
                        self.encoder.is_truncated(text))

    # the decision -------------------------------------------------------------------
    def decide(self, question: Question, candidates: Iterable[Candidate]) -> Match | NoMatch:
        """The candidate that answers ``question``, or why none does. ``candidates`` come
        best first; only the first ``settings.candidates`` are looked at. A declined near
        match is counted by its kind, whichever source (cache or pack) asked."""
        decision = self._decide(question, candidates)
        if isinstance(decision, NoMatch) and decision.veto_kind is not None:
            self._store.add_to_counter(DECLINED + decision.veto_kind)
        return decision

    def _decide(self, question: Question, candidates: Iterable[Candidate]) -> Match | NoMatch:
        tau, best, rejected_before = self.recall_tau, None, False
        counting: list[Candidate] = []
        for candidate in islice(candidates, self.settings.candidates):
            best = candidate.similarity if best is None else best
            if question.truncated and embedding_text(candidate.text) != question.key:
                continue
            own = tau if candidate.evidence is None or not self.settings.entry_thresholds \
                else entry_threshold.threshold(candidate.evidence, tau)
            if candidate.similarity < own:
                rejected_before = rejected_before or candidate.similarity >= tau
                continue
            if not self.settings.learned:
                return self._ruled(question, candidate, best, CHECKS) \
                    if self.settings.verify_hits else Match(candidate)
            counting.append(candidate)
            if len(counting) == VERIFIED_AT_MOST:
                break
        if counting:
            return self._verified(question, counting, best)
        if rejected_before:
            return NoMatch("a similar question's cached answer was rejected before", best)
        if question.truncated and best is not None and best >= tau:
            return NoMatch("the question is longer than the embedding model's window, and "
                           "only the very same question matches it", best)
        return NoMatch(NOTHING_CLOSE, best)

    def _ruled(self, question: Question, candidate: Candidate, best: float | None,
               checks: Collection[str], probability: float | None = None
               ) -> Match | NoMatch:
        """``candidate``, unless one of the rules' ``checks`` vetoes it (then a miss)."""
        veto = verify(question.text, candidate.text, checks)
        if veto is None:
            return Match(candidate, probability)
        log.info("vetoed %r for %r (similarity %.3f): %s", candidate.text, question.text,
                 candidate.similarity, veto.reason)
        return NoMatch(veto.reason, best, veto.summary)

    def _verified(self, question: Question, counting: list[Candidate], best: float | None
                  ) -> Match | NoMatch:
        """The counting candidate the verifier finds most likely the same question, if it
        alone clears the verifier's threshold (``ambiguous``) and the rules kept beside it
        (``WITH_LEARNED``) do not veto it; the very same question passes by identity."""
        for candidate in counting:
            if embedding_text(candidate.text) == question.key:
                return Match(candidate, 1.0)
        verifier = self.verifier
        probabilities = verifier.probabilities(question.text, [c.text for c in counting])
        top = int(np.argmax(probabilities))
        probability = float(probabilities[top])
        if probability < verifier.threshold:
            log.info("verifier vetoed %d candidates for %r (best %r, p=%.3f)",
                     len(counting), question.text, counting[top].text, probability)
            kind = "the verifier judged it a different question"
            return NoMatch(f"{kind} (p={probability:.2f})", best, kind)
        if ambiguous(probabilities, verifier.threshold):
            log.info("verifier passed more than one of %d candidates for %r: ambiguous",
                     len(counting), question.text)
            kind = "several cached questions were judged the same question"
            return NoMatch(f"{kind} (p={probability:.2f} and more; which one is meant is a "
                           "guess)", best, kind)
        return self._ruled(question, counting[top], best, WITH_LEARNED, probability)

    # feedback -----------------------------------------------------------------------
    def accepted(self, question: str, origin: Matched) -> None:
        """A match was served: a weakly positive pair until the user rejects it."""
        self._store.put_pair(origin.hit_id, self.pair(question, origin, 1))

    def pair(self, question: str, origin: Matched, label: int) -> dict[str, object]:
        return feedback.record(question, origin.matched_query, origin.similarity,
                               origin.feedback_key, label, time.time())

    def already_rejected(self, origin: Matched) -> bool:
        record = self._store.get_pair(origin.hit_id)
        return record is not None and record.get("label") == 0

    def rejected(self, question: str, origin: Matched) -> ThresholdChange:
        """The user says the match was wrong: a negative pair, then tau re-tuned. Once per
        hit: rejecting it again (say after the fresh answer failed) records nothing."""
        with self._feedback:
            if self.already_rejected(origin):
                tau = self.tau
                return ThresholdChange(tau, tau, *self._counts(),
                                       "this answer's rejection was recorded before")
            self._store.put_pair(origin.hit_id, self.pair(question, origin, 0))
            self._store.add_to_counter("rejections")
        return self.retune()

    def _counts(self) -> tuple[int, int]:
        labels = [p.label for p in feedback.labelled_pairs(self._store)]
        return sum(labels), len(labels) - sum(labels)

    def retune(self, max_pairs: int = 2000) -> ThresholdChange:
        """Maximise F0.5 over the labelled pairs, re-scored in the current space."""
        pairs = feedback.labelled_pairs(self._store, newest=max_pairs)
        labels = np.array([p.label for p in pairs], dtype=int)
        positives, negatives = int(labels.sum()), int(len(labels) - labels.sum())
        old = self.tau
        need = self.settings.tune_min_per_class
        if positives < need or negatives < need:
            return ThresholdChange(
                old, old, positives, negatives,
                f"needs {need} accepted and {need} rejected hits to re-tune; "
                f"has {positives} and {negatives}",
            )
        a = embed_texts(self.encoder, [p.q1 for p in pairs])
        b = embed_texts(self.encoder, [p.q2 for p in pairs])
        best = best_threshold((a * b).sum(1), labels)
        new = round(nearest_threshold(best.threshold), 4)
        self.thresholds.set_local(new)
        return ThresholdChange(old, new, positives, negatives,
                               f"F0.5 {best.f05:.3f} on {len(pairs)} labelled pairs")
