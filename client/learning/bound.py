"""The error bound the user sets: the lowest judge score at which the cache may answer
while, with ``confidence``, at most ``max_wrong_rate`` of the answers it serves are wrong.

The score is the judge's (``client.matching.matcher.Matcher.judge``): by default the
learned decision's score of the verifier's pick (shared.verifier.decision); where its card
does not fit the verifier or the encoder, or ``decision`` is "rules", the learned
verifier's probability of the best candidate; with the verifier off (``verify_hits``
false, or the rules verifier) the embedding's cosine of the most similar one, whose prior
is tau.
Each labelled example is a served-region pair: its
score, whether the cached answer was wrong, and how likely it was to be labelled at all
(1 for a miss whose best candidate was compared anyway, the exploration rate for a
would-be hit sent upstream too). The error among answers served at threshold t is
estimated from the examples scoring >= t, each weighted by the inverse of its labelling
probability (so a sparsely explored region is not under-counted), with Kish's effective
sample size standing in for the count.

The bound is a one-sided Clopper–Pearson upper limit on that error (exact binomial),
tested in fixed sequence from the highest threshold down, stopping at the first that
fails: Learn-then-Test (Angelopoulos, Bates, Candès, Jordan, Lei, 2021, arXiv 2110.01052),
whose fixed-sequence procedure keeps the family-wise error at 1 - ``confidence`` without
a multiplicity correction. vCache (arXiv 2502.03771) learns the same kind of boundary per
entry; here the entry's own evidence may only raise its threshold above the global one.

The learned decision's card ships labels of its own (its choose splits' picks: a judge's
``evidence``), tested as pooled labels are, so a new device's first threshold is backed
by labels, and where they back none, nothing is served (no prior). For the other judges,
until the labels pass the test somewhere, the judge's own threshold (the verifier's card,
chosen on QQP dev; tau) is the prior: a new device starts at today's behaviour. Labels
that show the prior's region is too wrong (the lower confidence limit of its error above
the bound) raise the threshold past every score seen, so only aliases and the very same
question are served until the evidence passes somewhere. Only labels drawn with a known
chance may show that: a user's "wrong answer" is pressed on wrong answers only, so it
raises its own entry's threshold (and counts as an error wherever a region is tested to
pass) but never closes the whole cache on its own.

Federated learning pools the labels of many devices (shared.fl.bound_evidence: per score
bin the sums of w, w² and w·wrong, which are all the test reads), so that 149 labels come
sooner than one device gathers them: ``choose_pooled`` tests the pool together with the
device's own newer labels, row by row as ``choose`` tests labels alone, and lets the
device's own labels refuse a region they show too wrong.
"""

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

import numpy as np
from meancache.shared.fl.bound_evidence import BoundEvidence

# the Beta CDF and quantile (scipy.stats: seconds to import)
from scipy.special import betainc, betaincinv

CONFIDENCE = 0.95
NEVER = 1.0 + 1e-9  # a threshold no score reaches
USER = "user"
MIN_ENTRY_LABELS = 3  # an entry's own labels before its evidence counts (vCache: per entry)


# The counting candidates a verifier weighed for a question (each stored question's key
# and cosine, most similar first): a label keeps them, so that another judge (a global
# verifier from federated learning) scores its pick anew in the same company
# (client.device_caches), as the learned decision's score depends on the rivals.
Weighed = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Label:
    """One labelled served-region pair: the judge's score, whether the cached answer was
    wrong, the probability that this pair got labelled, the entry it concerns, the
    question asked of it (normalised; kept on the device, where federated learning trains
    the verifier on the pair: client.device_caches), which judge gave the score (its
    verifier's card.judge: a score means something only to the judge that gave it) and
    what that judge weighed."""

    score: float
    wrong: bool
    labelled_with: float = 1.0
    entry: str = ""
    source: str = "miss"  # "miss", "explore" or "user" (a "wrong answer": the strongest)
    question: str = ""
    judge: str = ""
    weighed: Weighed = ()  # empty: the pair alone (a "wrong answer", older labels)


@dataclass(frozen=True)
class Judge:
    """Who scores a pick (a score means something only to the judge that gave it), the
    threshold the bound starts from (its prior) and the evidence the judge ships with:
    the learned decision's card carries its choose splits' picks as labels of its score
    (shared.verifier.decision), tested as pooled labels are (``choose_pooled``).
    ``prior_from``: the evidence of the judge this one derives from (the card's, over
    the verifier a federated one was fine-tuned from): not this judge's labels, so it
    backs nothing here, but the threshold it backs (``backed``) replaces ``prior``."""

    name: str
    prior: float
    evidence: BoundEvidence = field(default_factory=BoundEvidence.empty)
    prior_from: BoundEvidence = field(default_factory=BoundEvidence.empty)


@dataclass(frozen=True)
class Bound:
    """The threshold in force and what backs it: the estimated wrong share of served
    answers at it and its upper confidence limit (None where no label backs it)."""

    threshold: float
    estimate: float | None
    upper: float | None
    labels: int
    learned: bool  # the labels chose it (else the prior or the raised guard)
    # of ``labels``, those not this device's: pooled from other devices (federated
    # learning) or the judge's own (the learned decision's card: client.learning.state)
    pooled: int = 0
    # closed by labels that show a region too wrong: their lower confidence limit, which
    # is over the rate (the estimate and upper are theirs too), so that a user is told why
    # nothing is served by score, not that nothing is estimated yet
    lower: float | None = None

    @property
    def closed(self) -> bool:
        """No score is served: no region is backed, or the labels refused the one there was
        (only aliases and the very same question are answered from the store)."""
        return self.threshold >= NEVER


@dataclass(frozen=True)
class OwnLabels:
    """A device's own sampled labels over a threshold (``Learned.own_over``): what the
    exploration's warm-up waits for before the region they fall in serves
    (client.learning.explore)."""

    labels: int
    wrong: int
    within_rate: bool  # wrong no more often than the rate, weighted as the bound weighs


def labels_needed(max_wrong_rate: float, confidence: float = CONFIDENCE) -> int:
    """The fewest labels, none of them wrong, with which any region can pass: below it the
    chance of seeing no error at a true rate of ``max_wrong_rate`` exceeds 1 - confidence,
    so no exact test may pass (149 at 2% and 95%). Labels pooled in any way cannot pass
    with fewer: it is the floor of how soon the bound can learn."""
    return math.ceil(math.log(1 - confidence) / math.log1p(-max_wrong_rate))


def labels_to_pass(wrong_share: float, max_wrong_rate: float,
                   confidence: float = CONFIDENCE) -> int:
    """The fewest labels with which a region wrong at ``wrong_share`` (under the rate) is
    expected to pass: its upper limit at the errors that share gives is within the rate.
    At half of 2%, 569 labels; at the judge's own 1.6% on its choose splits, 3,421."""
    if not 0 <= wrong_share < max_wrong_rate < 1:
        raise ValueError(f"the share {wrong_share!r} must lie under the rate {max_wrong_rate!r}")

    def passes(n: int) -> bool:
        return upper_limit(wrong_share * n, n, confidence) <= max_wrong_rate

    low, high = 0, labels_needed(max_wrong_rate, confidence)  # fewer never pass
    while not passes(high):  # the limit falls as labels grow: double, then bisect
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if passes(middle) else (middle, high)
    return high


def shipped_start(max_wrong_rate: float, confidence: float = CONFIDENCE) -> int:
    """Where the test of a judge's own evidence (the learned decision's card: thousands of
    labels) starts (``choose``'s ``start``): where a region as wrong as half the rate is
    expected to pass, so that a few wrong picks among its highest scores do not stop the
    sequence above the large regions under them."""
    return labels_to_pass(max_wrong_rate / 2, max_wrong_rate, confidence)


def backed(evidence: BoundEvidence, max_wrong_rate: float, confidence: float = CONFIDENCE
           ) -> float:
    """The lowest threshold ``evidence`` alone backs (tested from ``shipped_start``);
    ``NEVER`` where it backs none."""
    rows = Rows.pooled_bins(*evidence.rows())
    return choose(rows, max_wrong_rate, NEVER, confidence,
                  shipped_start(max_wrong_rate, confidence)).threshold


def upper_limit(errors: float, n: float, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper–Pearson upper limit of a binomial rate (1.0 without data)."""
    if n <= 0:
        return 1.0
    errors = min(max(errors, 0.0), n)
    if errors >= n:
        return 1.0
    return float(betaincinv(errors + 1, n - errors, confidence))


def lower_limit(errors: float, n: float, confidence: float = CONFIDENCE) -> float:
    """One-sided Clopper–Pearson lower limit (0.0 without errors)."""
    if n <= 0 or errors <= 0:
        return 0.0
    errors = min(errors, n)
    return float(betaincinv(errors, n - errors + 1, 1 - confidence))


@dataclass(frozen=True)
class Rows:
    """Labels as the test reads them: per row its score, how many labels it stands for,
    and the sums of their weights w, of w² and of w·wrong (w = 1 / labelled_with). A
    device's own label is one row; a bin of the evidence pooled by federated learning
    (shared.fl.bound_evidence) is another, at its lower edge, and ``pooled`` counts it.
    ``sampled``: 1 where the row was drawn with a known chance (a compared miss, an
    exploration, a pooled bin), 0 for a user's "wrong answer", which is never a sample
    of the served answers: a user presses it on wrong answers only, and says nothing of
    the right ones, so it may not show a region too wrong (``_refusal``)."""

    score: np.ndarray
    count: np.ndarray
    weight: np.ndarray
    squares: np.ndarray
    wrong: np.ndarray
    pooled: np.ndarray
    sampled: np.ndarray

    @classmethod
    def of(cls, labels: Sequence[Label]) -> "Rows":
        w = 1.0 / np.clip([label.labelled_with for label in labels], 1e-3, 1.0)
        x = np.array([label.wrong for label in labels], dtype=float)
        return cls(np.array([label.score for label in labels], dtype=float),
                   np.ones(len(labels)), w, w ** 2, w * x, np.zeros(len(labels)),
                   np.array([label.source != USER for label in labels], dtype=float))

    @classmethod
    def pooled_bins(cls, score: np.ndarray, count: np.ndarray, weight: np.ndarray,
                    squares: np.ndarray, wrong: np.ndarray) -> "Rows":
        return cls(score, count, weight, squares, wrong, count, np.ones(len(score)))

    @classmethod
    def of_any(cls, labels: "Sequence[Label] | Rows") -> "Rows":
        return labels if isinstance(labels, Rows) else cls.of(labels)

    def __getitem__(self, index: slice | np.ndarray) -> "Rows":
        """The rows ``index`` (a slice or a mask) picks."""
        return Rows(*(a[index] for a in self._arrays()))

    def inserted(self, at: int, other: "Rows") -> "Rows":
        """These rows with ``other``'s placed before row ``at``."""
        return Rows(*(np.insert(a, at, b) for a, b in zip(self._arrays(), other._arrays(),
                                                           strict=True)))

    def deleted(self, at: int) -> "Rows":
        """These rows without row ``at``."""
        return Rows(*(np.delete(a, at) for a in self._arrays()))

    def __add__(self, other: "Rows") -> "Rows":
        return Rows(*(np.concatenate([a, b]) for a, b in zip(self._arrays(),
                                                             other._arrays(), strict=True)))

    def _arrays(self) -> tuple[np.ndarray, ...]:
        return (self.score, self.count, self.weight, self.squares, self.wrong, self.pooled,
                self.sampled)

    def __len__(self) -> int:
        return len(self.score)


Sums = TypeVar("Sums", float, np.ndarray)


def _weighted(total: Sums, squares: Sums, errors: Sums) -> tuple[Sums, Sums]:
    """The estimated wrong share of weighted labels and their effective count (Kish's
    effective sample size), from the sums of their weights, squared weights and weighted
    errors (arrays of tails, or one tail's totals)."""
    return errors / total, total ** 2 / squares


def _tails(rows: Rows) -> tuple[np.ndarray, ...]:
    """For each distinct score, highest first: (score, estimated wrong share, effective
    errors, effective n, labels, pooled labels) among the rows scoring at least that.
    The sort is stable, and on rows already in that order (a device's own, as
    client.learning.state keeps them) it costs one pass, not a sort."""
    order = np.argsort(-rows.score, kind="stable")
    s = rows.score[order]
    last = np.r_[s[1:] != s[:-1], True]  # the last row of each run of equal scores
    total, squares, errors, counts, pooled = (
        np.cumsum(a[order])[last] for a in (rows.weight, rows.squares, rows.wrong,
                                            rows.count, rows.pooled))
    share, n_eff = _weighted(total, squares, errors)
    return s[last], share, share * n_eff, n_eff, counts, pooled


def choose(labels: Sequence[Label] | Rows, max_wrong_rate: float, prior: float,
           confidence: float = CONFIDENCE, start: float | None = None) -> Bound:
    """The lowest threshold the labels support at ``max_wrong_rate`` (fixed-sequence
    testing from the top), else the ``prior`` threshold, raised past every score where the
    labels show the prior's region too wrong. ``labels`` may come as their ``Rows``
    (client.learning.state keeps them so, as they come). ``start``: the fewest (effective)
    labels of the tail where the sequence begins (default ``labels_needed``, the fewest
    with which any region can pass); a larger one, fixed before the labels are seen, keeps
    a small top region that is a little wrong from stopping the sequence before the large
    ones under it are tested (benchmarks/bound_start.py)."""
    if not 0 < max_wrong_rate < 1:
        raise ValueError(f"max_wrong_rate must lie between 0 and 1, not {max_wrong_rate!r}")
    if not len(labels):
        return Bound(prior, None, None, 0, False)
    return _choose(Rows.of_any(labels), max_wrong_rate, prior, confidence, start)


def choose_pooled(own: Sequence[Label] | Rows, unsent: Sequence[Label] | Rows, pooled: Rows,
                  max_wrong_rate: float, prior: float, confidence: float = CONFIDENCE,
                  start: float | None = None) -> Bound:
    """The bound on the evidence federated learning pooled (``pooled``: other devices'
    labels, and this device's as it last sent them) together with this device's labels
    learned since (``unsent``: so none counts twice). The device's own labels (``own``,
    all of them) may still refuse it: where they show the chosen region too wrong (the
    lower confidence limit of its error above the bound), their traffic is not the
    pool's, and the bound on them alone (``choose``) stands; where that is closed with no
    numbers of its own (a judge without a prior), it carries those of the labels that
    refused the region. ``start``: as ``choose``'s, for the merged test."""
    own = Rows.of_any(own)
    alone = choose(own, max_wrong_rate, prior, confidence)
    if not len(pooled):
        return alone
    merged = _choose(Rows.of_any(unsent) + pooled, max_wrong_rate, prior, confidence, start)
    refused = _refusal(own, merged.threshold, max_wrong_rate, confidence)
    if refused is not None:
        # what refused it, where the bound on the labels alone has no numbers of its own
        return refused if alone.closed and alone.estimate is None else alone
    return merged


def _refusal(rows: Rows, threshold: float, max_wrong_rate: float, confidence: float
             ) -> Bound | None:
    """The closed bound where the sampled rows scoring at least ``threshold`` show its
    region too wrong (the lower confidence limit of their error above the rate); None
    where they do not. A user's "wrong answer" is not among them (``Rows.sampled``): it
    raises its entry's threshold (``entry_threshold``) and counts in every test that may
    pass a region, but one press must not close the whole cache."""
    tail = rows[(rows.score >= threshold) & (rows.sampled > 0)]
    if not len(tail):
        return None
    # the tail's totals, as ``_tails`` gives them at its last row, without its sort
    share, n = _weighted(float(tail.weight.sum()), float(tail.squares.sum()),
                         float(tail.wrong.sum()))
    lower = lower_limit(share * n, n, confidence)
    if lower <= max_wrong_rate:
        return None
    return Bound(NEVER, share, upper_limit(share * n, n, confidence),
                 _whole(tail.count.sum()), False, _whole(tail.pooled.sum()), lower)


def _choose(rows: Rows, max_wrong_rate: float, prior: float, confidence: float,
            start_at: float | None = None) -> Bound:
    at, share, errors, n, counts, pooled = _tails(rows)
    # The sequence starts where the tail holds enough labels to pass at all (no error in
    # log(1 - confidence) / log(1 - rate) labels): above it nothing can be tested.
    enough = max(labels_needed(max_wrong_rate, confidence), start_at or 0)
    start = int(np.argmax(n >= enough)) if (n >= enough).any() else len(at)
    last = _first_failure(errors, n, start, max_wrong_rate, confidence) - 1
    last = last if last >= start else -1  # fixed sequence: stop at a failure
    if last >= 0:
        return Bound(float(at[last]), float(share[last]),
                     upper_limit(errors[last], n[last], confidence),
                     _whole(counts[last]), True, _whole(pooled[last]))
    above = np.flatnonzero(at >= prior)
    if not len(above):
        if prior >= NEVER and start < len(at):  # closed: the region whose test failed first
            return Bound(prior, float(share[start]),
                         upper_limit(errors[start], n[start], confidence),
                         _whole(counts[start]), False, _whole(pooled[start]))
        return Bound(prior, None, None, 0, False)
    i = above[-1]
    refused = _refusal(rows, prior, max_wrong_rate, confidence)
    if refused is not None:
        return refused
    return Bound(prior, float(share[i]), upper_limit(errors[i], n[i], confidence),
                 _whole(counts[i]), False, _whole(pooled[i]))


def _first_failure(errors: np.ndarray, n: np.ndarray, start: int, max_wrong_rate: float,
                   confidence: float) -> int:
    """The first row from ``start`` whose upper limit exceeds ``max_wrong_rate`` (the
    length where none does). The bound is recomputed after each new label, over up to
    20,000 labels (``client.learning.state.KEPT``), so it is tested without
    inverting the Beta distribution (the upper limit u exceeds the rate r exactly where
    the Beta(e + 1, n - e) CDF at r is under ``confidence``: that CDF rises with x and
    equals it at u; 6 times cheaper than the inverse), and in blocks that double from
    ``start``, since the sequence stops at its first failure. With the labels' rows kept
    in score order as they come (client.learning.state), a recomputation at 20,000
    labels fell from 33.9 to 2.5 ms (benchmarks/bound_cost.py)."""
    block = 64
    while start < len(n):
        e, m = errors[start:start + block], n[start:start + block]
        fails = betainc(e + 1, np.maximum(m - e, 1e-12), max_wrong_rate) < confidence
        if fails.any():
            return start + int(np.argmax(fails))
        start, block = start + block, 2 * block
    return len(n)


def _whole(count: float) -> int:
    return int(round(float(count)))


def entry_threshold(global_threshold: float, own: Iterable[Label],
                    min_labels: int = MIN_ENTRY_LABELS) -> float:
    """An entry's threshold: the global one, raised just above the highest score at which
    the entry's answer was found wrong once it has ``min_labels`` labels of its own (a
    "wrong answer" from the user counts at once). Never looser than the global bound."""
    own = list(own)
    wrong = [label.score for label in own if label.wrong]
    if not wrong:
        return global_threshold
    strongest = any(label.source == USER and label.wrong for label in own)
    if len(own) < min_labels and not strongest:
        return global_threshold
    return max(global_threshold, max(wrong) + 1e-6)
