"""The one decision of "this stored question answers that one", for every answer source
that matches by meaning (the instruction pack's similar match and the semantic cache),
and the one path of feedback on such a match (``Matcher.feedback``).

The ``Matcher`` holds what the decision needs: the encoder (the vector space, switched
only by the cache that owns it: client/cache/space.py), tau (the cache's
``ThresholdState``) and the per-entry thresholds, the verifier, the candidate count, and
a memo of the last questions' vectors (the pack and then the cache embed the current
question once). The rule, the same for every
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
    counting candidates, each pair alone, and the most probable (the pick) is served
    (the very same question passes by identity) as ``settings.decision`` says:
    "rules": if its probability reaches the verifier's threshold, no other candidate's
    does too (``ambiguous``), and the rule checks kept beside it (``rules.WITH_LEARNED``:
    a swapped direction, an opposite word) do not veto it; "learned": if the fitted
    decision (``decision.py``) serves it, with the hand-made parts its card keeps (with
    another verifier or encoder than its card names, "rules"; a federated fine-tune of
    its verifier is its own, under another judge: ``verifier_judge``). It is loaded only
    when this is chosen;
  - "rules" (``rules.verify``, every check) looks at the best counting candidate
    only and vetoes it when the two differ in a negation, number, name, ...
- the error bound learned from the device's traffic (``learned``, client/learning) moves
  the threshold the judge's score must reach: the learned verifier's probability, from
  its card's threshold; with the learned verifier off, the embedding's cosine, from tau
  (``judge``): the most similar counting candidate is then served where its cosine
  reaches the bound's threshold (and the rules, where on, pass it), and declined with
  its cosine remembered for a label where it does not.

Feedback on a served match: ``Matcher.feedback`` (client/matching/feedback.py).
"""

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import replace
from functools import lru_cache
from itertools import islice
from typing import TYPE_CHECKING, Protocol

import numpy as np
from meancache.client.learning.bound import Judge
from meancache.client.matching import entry_threshold
from meancache.client.matching.feedback import Feedback, Thresholds
from meancache.client.matching.labels import DECLINED, PairStore
from meancache.client.matching.question import (
    NOTHING_CLOSE,
    Candidate,
    Match,
    NoMatch,
    Query,
    Question,
)
from meancache.client.matching.rules import CHECKS, WITH_LEARNED, verify
from meancache.client.matching.settings import MatchSettings
from meancache.shared.encoder import Encoder
from meancache.shared.fl.bound_evidence import cosine_judge
from meancache.shared.query import embedding_text
from meancache.shared.verifier.decision import LearnedDecision, features
from meancache.shared.verifier.runtime import Card, LearnedVerifier

if TYPE_CHECKING:
    from meancache.client.learning.state import Learned

log = logging.getLogger(__name__)

MEMO_SIZE = 64  # question vectors remembered (a follow-up's context was the last question)
BELOW_BOUND = "under the similarity the cache's labels allow"
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
def learned_decision() -> LearnedDecision:
    """The shipped decision card, loaded (and checked) once."""
    return LearnedDecision.load()


def verifier_judge(card: Card, decision: LearnedDecision | None) -> Judge:
    """The judge of a verifier (its ``card``) and, where it decides with it, the learned
    decision (``Matcher.decision_card``): the decision's score from its card's threshold
    with the evidence it ships; over a federated fine-tune of the card's verifier, another
    judge whose prior is the threshold that evidence backs (it was scored by the base:
    shared.verifier.decision); without the decision, the verifier's probability from its
    card's threshold."""
    if decision is None:
        return Judge(card.judge, card.threshold)
    name = decision.judge_of(card.judge, card.tuned_from)
    if card.tuned_from:
        return Judge(name, decision.threshold, prior_from=decision.evidence)
    return Judge(name, decision.threshold, decision.evidence)


@lru_cache(maxsize=1)
def shipped_verifier() -> LearnedVerifier:
    """The verifier that ships with meancache, loaded (and hash-checked) once."""
    return LearnedVerifier.load()


class Matcher:
    def __init__(self, encoder: Encoder, thresholds: Thresholds, store: PairStore,
                 settings: MatchSettings, verifier: Verifier | None = None,
                 decision: LearnedDecision | None = None) -> None:
        """``store``: where declined matches are counted and the labelled pairs live.
        ``verifier``: the learned one, used only when the settings choose it; the shipped
        one by default, loaded on the first decision that needs it. ``decision``: the
        learned decision's card, the shipped one by default (benchmarks move its
        threshold)."""
        self.encoder = encoder  # the cache's current vector space (client/cache/space.py)
        self.thresholds = thresholds
        self.settings = settings
        self._verifier = verifier
        self._card = decision
        self._store = store
        self._lock = threading.Lock()  # the memo
        self._memo: OrderedDict[tuple[str, str], np.ndarray] = OrderedDict()
        self.feedback = Feedback(self, store)  # what served matches and rejections teach
        # The error bound learned from this device's traffic (client/learning/state.py):
        # where set, its threshold on the judge's score replaces the judge's own.
        self.learned: Learned | None = None
        self._warned = False  # the decision card fits another verifier or encoder (logged)

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
        checks them (it, not the similarity, decides) or the learned bound does (its labels
        may lower the similarity that serves), tau itself otherwise."""
        learning = self.settings.learned or self.learned is not None
        return self.tau - (self.settings.recall_margin if learning else 0.0)

    @property
    def judge(self) -> Judge:
        """Who scores a pick for the learned bound, and the threshold it starts from (the
        bound's prior): the learned decision's score (its card's ``judge``, with the
        evidence the card ships) from the card's threshold where the card decides, else
        the learned verifier's probability (``card.judge``) from its card's threshold, or
        with it off the embedding's cosine from tau. A score means something only to the
        judge that gave it, so the cosine's is named by the vector space."""
        if self.settings.learned:
            verifier = self.verifier
            card = getattr(verifier, "card", None)
            if card is not None:
                return verifier_judge(card, self.decision_card())
            return Judge("", verifier.threshold)
        return Judge(cosine_judge(self.encoder.version), self.tau)

    def judge_score(self, query: str, stored: str) -> float:
        """The judge's score of ``stored`` as the answer's question for ``query``, the pair
        alone (the learned decision's: as it scores a lone candidate)."""
        cosine = float(np.dot(self.embed(query), self.embed(stored)))
        if not self.settings.learned:
            return cosine
        verifier = self.verifier
        probability = float(verifier.probabilities(query, [stored])[0])
        decision = self.decision_card()
        if decision is None:
            return probability
        return decision.score(features([cosine], [probability], self.recall_tau,
                                       verifier.threshold))

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

    def question(self, query: Query | str) -> Question:
        """``query`` (a ``Query``, or a text already cleaned) as sources compare it."""
        text = query.text if isinstance(query, Query) else query
        return Question(text, embedding_text(text), self.embed(text),
                        self.encoder.is_truncated(text))

    def nearest(self, question: Question, vectors: np.ndarray, keys: Sequence[str],
                offered: Callable[[str], bool]) -> Iterator[Candidate]:
        """The candidates among ``keys`` (stored questions, ``vectors`` their rows in the
        current space) a decision looks at, best first: at most ``settings.candidates``,
        none under ``floor``, less those ``offered`` refuses (rejected before)."""
        similarities = vectors @ question.vector
        count = min(self.settings.candidates, len(similarities))
        best = np.argpartition(-similarities, count - 1)[:count]  # O(n), not a full sort
        for row in best[np.argsort(-similarities[best])]:
            similarity = float(similarities[row])
            if similarity < self.floor:
                return
            if offered(keys[row]):
                yield Candidate(keys[row], keys[row], min(similarity, 1.0))

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
                if self.learned is not None:
                    return self._bounded(question, candidate, best, self.learned)
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

    def _bounded(self, question: Question, pick: Candidate, best: float | None,
                 learned: "Learned") -> Match | NoMatch:
        """With the learned verifier off: the most similar counting candidate, where its
        cosine reaches the learned bound's threshold for its entry (tau until the labels
        choose; moved by the entry's own feedback as tau is, unless the labels closed the
        region) and the rules, where on, do not veto it; declined with its cosine kept
        for the label the upstream's answer will make."""
        if embedding_text(pick.text) == question.key:
            return Match(pick, pick.similarity)
        learned.use(self.judge)
        threshold = learned.threshold(pick.key)
        if pick.evidence is not None and self.settings.entry_thresholds and threshold < 1.0:
            # the entry's own feedback moves it relative to the threshold in force
            threshold = entry_threshold.threshold(pick.evidence, threshold)
        if pick.similarity < threshold:
            log.info("bound declined %r for %r (cosine %.3f < %.3f)", pick.text,
                     question.text, pick.similarity, threshold)
            return NoMatch(f"{BELOW_BOUND} ({pick.similarity:.2f} < {threshold:.2f})", best,
                           BELOW_BOUND, (pick.key, pick.similarity))
        if self.settings.verify_hits:
            return self._ruled(question, pick, best, CHECKS, pick.similarity)
        return Match(pick, pick.similarity)

    def _verified(self, question: Question, counting: list[Candidate], best: float | None
                  ) -> Match | NoMatch:
        """The counting candidate the verifier finds most likely the same question, if it
        alone clears the verifier's threshold (``ambiguous``) and the rules kept beside it
        (``WITH_LEARNED``) do not veto it; the very same question passes by identity.
        Either way it says which candidates were weighed (``Weighed``)."""
        for candidate in counting:
            if embedding_text(candidate.text) == question.key:
                return Match(candidate, 1.0)
        return replace(self._picked(question, counting, best),
                       weighed=tuple((c.key, c.similarity) for c in counting))

    def _picked(self, question: Question, counting: list[Candidate], best: float | None
                ) -> Match | NoMatch:
        verifier = self.verifier
        probabilities = verifier.probabilities(question.text, [c.text for c in counting])
        top = int(np.argmax(probabilities))
        probability = float(probabilities[top])
        decision = self.decision_card()
        threshold = verifier.threshold if decision is None else decision.threshold
        if self.learned is not None:
            self.learned.use(self.judge)
            threshold = self.learned.threshold(counting[top].key)
        if decision is not None:
            return self._decided(question, counting, probabilities, threshold, best, decision)
        if probability < threshold:
            log.info("verifier vetoed %d candidates for %r (best %r, p=%.3f)",
                     len(counting), question.text, counting[top].text, probability)
            kind = "the verifier judged it a different question"
            return NoMatch(f"{kind} (p={probability:.2f})", best, kind,
                           (counting[top].key, probability))
        if ambiguous(probabilities, threshold):
            log.info("verifier passed more than one of %d candidates for %r: ambiguous",
                     len(counting), question.text)
            kind = "several cached questions were judged the same question"
            return NoMatch(f"{kind} (p={probability:.2f} and more; which one is meant is a "
                           "guess)", best, kind)
        return self._ruled(question, counting[top], best, WITH_LEARNED, probability)

    def decision_card(self) -> LearnedDecision | None:
        """The learned decision where the settings choose it and the verifier and the
        encoder are the ones its card was fitted on (its coefficients weigh their
        probabilities and cosines); None: the rules decide (logged once)."""
        if self.settings.decision != "learned":
            return None
        decision = self._card or learned_decision()
        card = getattr(self.verifier, "card", None)
        if not decision.fits(getattr(card, "sha256", ""), decision.encoder_version,
                             getattr(card, "tuned_from", "")):
            other = "verifier than this one (or than the one it was fine-tuned from)"
        elif self.encoder.model_version != decision.encoder_version:
            other = (f"encoder ({decision.encoder} {decision.encoder_version}) than this one "
                     f"({self.encoder.model_version})")
        else:
            return decision
        if not self._warned:
            self._warned = True
            log.warning("the learned decision was fitted on another %s: the rules decide",
                        other)
        return None

    def _decided(self, question: Question, counting: list[Candidate],
                 probabilities: np.ndarray, threshold: float, best: float | None,
                 decision: LearnedDecision) -> Match | NoMatch:
        """The verifier's pick, if the learned decision's score (``decision.py``) reaches
        ``threshold`` (the card's, or the one the device's bound chose on that score:
        client/learning/bound.py) and the hand-made parts its card keeps do not refuse
        it; declined with its score kept for the label the upstream's answer will make."""
        top = int(np.argmax(probabilities))
        probability = float(probabilities[top])
        card = self.verifier.threshold
        score = decision.score(features([c.similarity for c in counting], probabilities,
                                        self.recall_tau, card))
        refused = ("floor" in decision.keeps and probability < card) \
            or ("ambiguity rule" in decision.keeps and ambiguous(probabilities, card))
        if score < threshold or refused:
            log.info("learned decision declined %r for %r (p=%.3f, score %.3f < %.3f)",
                     counting[top].text, question.text, probability, score, threshold)
            kind = "the verifier judged it a different question" if probability < card \
                else "the learned decision found it no clear match"
            # how far under the line it fell: the bound's threshold, or none where the
            # labels back no score (client/learning/bound.py's NEVER lies over 1)
            line = f"served from {threshold:.2f}" if threshold <= 1.0 \
                else "nothing served by score yet"
            return NoMatch(f"{kind} (p={probability:.2f}; decision score {score:.2f}, {line})",
                           best, kind, (counting[top].key, score))
        checks = WITH_LEARNED if "kept rules" in decision.keeps else ()
        return self._ruled(question, counting[top], best, checks, score)
