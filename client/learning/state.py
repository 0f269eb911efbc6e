"""What the cache learned, kept in its store: the labelled served-region pairs the bound
rests on, and the aliases (questions confirmed to share an entry's answer). This module
alone reads and writes them; ``reset`` undoes all of it and nothing else. It also keeps
the bound evidence federated learning pooled from other devices (``set_pooled``: a pool
per judge, the verifier's and the cosine's), which the bound tests together with the
labels this device learned since it last sent its own (``sent``), so that none counts
twice, where a pool names the judge now scoring; an open cache follows newly installed
pools at its next bound (``POOLED_VERSION``).

Labels are written in chunks of ``CHUNK``, each label together with the alias it confirms
in one transaction (``EntryStore.set_states``): a kill -9 leaves the state before or after
a label, never half of one. They are metadata, not entries: no generation bump, so other
processes do not reload their vector index for a label (they read the learning anew when
they open the cache). The bound itself is derived from the labels, never stored apart.
"""

import threading
import uuid
from dataclasses import asdict, replace
from typing import Any, Protocol

import numpy as np
from meancache.client.learning.bound import (
    CONFIDENCE,
    NEVER,
    Bound,
    Judge,
    Label,
    OwnLabels,
    Rows,
    backed,
    choose,
    choose_pooled,
    entry_threshold,
    labels_needed,
    shipped_start,
)
from meancache.shared.fl.bound_evidence import COSINE_JUDGE, BoundEvidence
from meancache.shared.query import normalise_query

PREFIX = "learning:"
_LABELS = PREFIX + "labels:"
_ALIAS = PREFIX + "alias:"
_SENT = PREFIX + "sent"  # how many labels had been learned when the device last sent them
# The evidence federated learning pooled (the signed global model's, installed by
# client.fl.device): the federation's, not this device's learning, so outside PREFIX
# and kept by ``reset`` as the global threshold is. A list of records, one per judge
# (one record alone: what was installed before the cosine's labels were pooled).
POOLED = "pooled-bound"
# A new token with every install: an open cache (this process's or another's) compares
# it, one record read, and reads the pool itself only when it moved.
POOLED_VERSION = "pooled-version"
# Whether the cache that last faced traffic on this store (the chat's, the proxy's)
# labelled it by the upstream's answers (the setting learn_from_answers, which depends on
# the upstream the chat was started with): `cache stats` reads it. A mode, not a label:
# outside PREFIX, kept by ``reset``.
LEARNS_FROM_ANSWERS = "learns-from-answers"
CHUNK = 256
KEPT = 20_000  # newest labels the bound rests on


class StateStore(Protocol):
    """Where the learning is kept: the cache's store (``client.cache.store.EntryStore``)."""

    def set_states(self, values: dict[str, Any]) -> None: ...

    def states(self, prefix: str) -> dict[str, Any]: ...

    def delete_states(self, prefix: str) -> int: ...

    def get_meta(self, name: str, default: Any = None) -> Any: ...


class Learned:
    """The device's learned labels, bound and aliases, loaded once and kept current."""

    def __init__(self, store: StateStore, max_wrong_rate: float, prior: float | None = None,
                 confidence: float = CONFIDENCE, judge: str = "") -> None:
        """``prior``: the judge's own threshold (the verifier's card), settable later, as
        is ``judge``, the identity of the judge whose scores the labels hold."""
        self._store = store
        self.max_wrong_rate = max_wrong_rate
        self._prior = prior
        self._judge = judge
        self._shipped: BoundEvidence | None = None  # the judge's own labels (``use``)
        # the evidence a derived judge's prior comes from (``use``), and that prior
        self._prior_from: BoundEvidence | None = None
        self._backed_at = NEVER
        self.confidence = confidence
        self._lock = threading.Lock()
        self._load()

    def _load(self) -> None:
        ordered = _chunks(self._store)
        self._chunk = int(ordered[-1][0][len(_LABELS):]) if ordered else 0
        self._current = list(ordered[-1][1]) if ordered else []
        everything = [Label(**record) for _, chunk in ordered for record in chunk]
        self._learned = len(everything)  # labels ever learned (the chunks are all kept)
        self.labels = everything[-KEPT:]
        self._sent = self._read_sent()
        self._pool_version = self._store.get_meta(POOLED_VERSION)
        self.pools = pools(self._store)
        self._aliases = {name[len(_ALIAS):]: entry_id
                         for name, entry_id in self._store.states(_ALIAS).items()
                         if entry_id is not None}
        self._bound: Bound | None = None
        self._own: Rows | None = None
        self._own_at = np.zeros(0, dtype=np.int64)  # each own row's place among all learned
        self._by_entry: dict[str, list[Label]] = {}
        for label in self.labels:
            self._by_entry.setdefault(label.entry, []).append(label)

    def _read_sent(self) -> int:
        """How many labels had been learned when the device last sent them (``_SENT``)."""
        return min(int(self._store.states(_SENT).get(_SENT) or 0), self._learned)

    # the bound -----------------------------------------------------------------------
    @property
    def prior(self) -> float | None:
        return self._prior

    @prior.setter
    def prior(self, value: float | None) -> None:
        if value != self._prior:
            self._prior, self._bound = value, None

    @property
    def judge(self) -> str:
        return self._judge

    @judge.setter
    def judge(self, value: str) -> None:
        """The judge now scoring (the verifier's ``card.judge``, or the name
        ``shared.fl.bound_evidence.cosine_judge`` gives the embedding's cosine):
        only its labels count, since another model's scores (a global verifier from
        federated learning, say) lie on another scale."""
        if value != self._judge:
            self._judge, self._bound, self._own = value, None, None

    def use(self, judge: Judge) -> None:
        """Score with ``judge``: its name, its threshold as the prior, and the evidence
        it ships with (the learned decision's card's: counted as pooled labels are).
        Called on every lookup: the bound is recomputed only when one of them changed."""
        self.judge = judge.name
        self.prior = judge.prior if not judge.prior_from.labels else self._backed(
            judge.prior_from)
        evidence = judge.evidence
        shipped = evidence if evidence.judge == judge.name and evidence.labels else None
        if shipped is not self._shipped:
            self._shipped, self._bound = shipped, None

    def _backed(self, evidence: BoundEvidence) -> float:
        """The threshold ``evidence`` backs at this bound's rate (``bound.backed``),
        computed once per evidence."""
        if self._prior_from is not evidence:
            self._prior_from = evidence
            self._backed_at = backed(evidence, self.max_wrong_rate, self.confidence)
        return self._backed_at

    def _counts(self, label: Label) -> bool:
        """The judge's own labels; those written before labels named their judge were
        the learned verifier's, so they never count for the cosine."""
        return label.judge == self._judge or (
            not label.judge and not self._judge.startswith(COSINE_JUDGE))

    @property
    def bound(self) -> Bound:
        if self.prior is None:
            raise ValueError("the bound needs the judge's own threshold as its prior")
        with self._lock:
            self._follow_pool()
            if self._bound is None:
                self._bound = self._chosen()
            return self._bound

    def _chosen(self) -> Bound:
        """The bound on the labels that count now (with the pool where it applies); the
        caller holds the lock and knows the prior."""
        assert self.prior is not None
        own = self._own_rows()
        applies = self._pool_applies()
        shipped = self._shipped
        if not applies and shipped is None:
            return choose(own, self.max_wrong_rate, self.prior, self.confidence)
        # the pool holds the labels sent before, as the server weighed them
        unsent = own[self._own_at >= self._sent] if applies else own
        pooled = (self.pooled if applies else BoundEvidence.empty()) \
            + (shipped or BoundEvidence.empty())
        # The judge's own evidence holds thousands of labels: its sequence starts later
        # (``shipped_start``). Nor does the judge need a prior: where no region passes,
        # none is served.
        start, prior = (shipped_start(self.max_wrong_rate, self.confidence), NEVER) \
            if shipped is not None else (None, self.prior)
        return choose_pooled(own, unsent, Rows.pooled_bins(*pooled.rows()),
                             self.max_wrong_rate, prior, self.confidence, start)

    def _recompute(self) -> None:
        """The bound after a new label or pool, computed now (beside the upstream call that
        brought the label) so that the next lookup finds it ready: 2.5 ms at 20,000 labels
        (benchmarks/bound_cost.py). Without a prior yet, the first read computes it."""
        self._bound = None if self.prior is None else self._chosen()

    def _own_rows(self) -> Rows:
        """The rows of the labels that count, highest score first (ties in the order they
        came), kept so as labels come and go: reading up to ``KEPT`` labels into arrays
        and sorting them at each recomputation was most of its cost once the test itself
        was made cheap (benchmarks/bound_cost.py)."""
        if self._own is None:
            first = self._learned - len(self.labels)  # the place of the oldest kept
            counted = [i for i, label in enumerate(self.labels) if self._counts(label)]
            rows = Rows.of([self.labels[i] for i in counted])
            order = np.argsort(-rows.score, kind="stable")
            self._own = rows[order]
            self._own_at = (first + np.array(counted, dtype=np.int64))[order]
        return self._own

    def _keep_row(self, label: Label) -> None:
        """``label``'s row among the kept ones, after those scoring at least as high."""
        assert self._own is not None
        at = int(np.searchsorted(-self._own.score, -label.score, side="right"))
        self._own = self._own.inserted(at, Rows.of([label]))
        self._own_at = np.insert(self._own_at, at, self._learned - 1)

    def _drop_oldest_row(self) -> None:
        assert self._own is not None
        at = int(np.argmin(self._own_at))
        self._own, self._own_at = self._own.deleted(at), np.delete(self._own_at, at)

    def _follow_pool(self) -> None:
        """A pool installed since this cache read its own (by `fl sync` or a round, in
        any process: client.fl.device writes through a store of its own) counts from the
        next bound on, not from the next open: one record read each time, the pool
        itself read only when its version moved."""
        version = self._store.get_meta(POOLED_VERSION)
        if version != self._pool_version:  # the labels sent for it are in it now
            self._pool_version, self.pools, self._bound = version, pools(self._store), None
            self._sent = self._read_sent()

    @property
    def pooled(self) -> BoundEvidence:
        """The installed pool naming the judge now scoring; where none does, the first
        installed (kept, and ignored by the bound), or none."""
        named = [pool for pool in self.pools if self._judge and pool.judge == self._judge]
        return next(iter(named or self.pools), BoundEvidence.empty())

    def _pool_applies(self) -> bool:
        """A pool counts only where it holds labels of the judge now scoring: another
        verifier's scores, another vector space's cosines (or a pool naming none) would
        say nothing of this one's."""
        return bool(self.pooled.labels and self._judge
                    and self.pooled.judge == self._judge)

    def install_pooled(self, *evidence: BoundEvidence) -> None:
        """The federation's pooled evidence, for this open cache (a proxy cache made after
        the device installed it: client/proxy/partitions.py)."""
        with self._lock:
            self._pool_version = set_pooled(self._store, *evidence)
            self.pools, self._sent = pools(self._store), self._read_sent()
            self._recompute()

    @property
    def unsent(self) -> int:
        """Labels learned since the device last sent its evidence to a round (the pool
        holds those before; the bound merges it with these)."""
        return self._learned - self._sent

    def threshold(self, entry: str | None = None) -> float:
        """The score from which ``entry`` (or any entry) may be served."""
        threshold = self.bound.threshold
        if entry is None:
            return threshold
        return entry_threshold(threshold, filter(self._counts, self._by_entry.get(entry, ())))

    def own_over(self, threshold: float) -> OwnLabels:
        """This device's sampled labels of the judge (not a user's "wrong answer": never a
        sample) scoring at least ``threshold``: how many, how many wrong, and whether
        they are wrong no more often than the rate (weighted as the bound weighs them)."""
        with self._lock:
            own = self._own_rows()  # highest score first
            over = int(np.searchsorted(-own.score, -threshold, side="right"))
            tail = own[:over][own.sampled[:over] > 0]
            return OwnLabels(int(tail.count.sum()), int(np.count_nonzero(tail.wrong)),
                             float(tail.wrong.sum())
                             <= self.max_wrong_rate * float(tail.weight.sum()))

    def settled(self, threshold: float) -> bool:
        """Whether labels of traffic settle ``threshold``: the labels chose the bound,
        enough of this device's, with the federation's pool where it applies, score at
        least ``threshold`` to pass the test at all (``labels_needed``), and their
        estimated wrong share there is within the rate. The judge's own evidence (the
        learned decision's card: its choose splits, not anyone's traffic) backs a
        threshold before the device has a label; exploration checks it against the
        traffic until then, and for as long as the traffic looks more often wrong than
        that evidence allows (client.learning.explore)."""
        if not self.bound.learned:
            return False
        with self._lock:
            own = self._own_rows()  # highest score first: the tail is a prefix
            over = int(np.searchsorted(-own.score, -threshold, side="right"))
            tail = own[:over]
            if self._pool_applies():  # the labels sent are in the pool: count them once
                score, *sums = self.pooled.rows()
                tail = tail[self._own_at[:over] >= self._sent] \
                    + Rows.pooled_bins(score, *sums)[score >= threshold]
        return float(tail.count.sum()) >= labels_needed(self.max_wrong_rate, self.confidence) \
            and float(tail.wrong.sum()) <= self.max_wrong_rate * float(tail.weight.sum())

    # labels and aliases ----------------------------------------------------------------
    def learn(self, label: Label, question: str | None = None) -> None:
        """Record ``label`` with ``question`` (normalised); a right answer for it
        (``label.wrong`` false) also makes it an alias of the label's entry."""
        if question is not None and not label.question:
            label = replace(label, question=normalise_query(question))
        if not label.judge:
            label = replace(label, judge=self._judge)
        with self._lock:
            if len(self._current) >= CHUNK:
                self._chunk, self._current = self._chunk + 1, []
            self._current.append(asdict(label))
            writes: dict[str, object] = {f"{_LABELS}{self._chunk}": list(self._current)}
            alias = None if not label.question or label.wrong or not label.entry \
                else label.question
            if alias is not None:
                writes[_ALIAS + alias] = label.entry
            self._store.set_states(writes)
            self.labels.append(label)
            self._learned += 1
            self._by_entry.setdefault(label.entry, []).append(label)
            if self._own is not None and self._counts(label):
                self._keep_row(label)
            if len(self.labels) > KEPT:
                gone = self.labels.pop(0)
                self._by_entry[gone.entry].remove(gone)
                if self._own is not None and self._counts(gone):
                    self._drop_oldest_row()
            if alias is not None:
                self._aliases[alias] = label.entry
            self._recompute()

    def alias(self, question: str) -> str | None:
        """The entry ``question`` was confirmed to share an answer with, if any."""
        return self._aliases.get(normalise_query(question))

    def forget_alias(self, question: str) -> None:
        """An alias whose answer was rejected, or whose entry is gone, stops answering."""
        key = normalise_query(question)
        with self._lock:
            if self._aliases.pop(key, None) is not None:
                self._store.set_states({_ALIAS + key: None})

    @property
    def aliases(self) -> int:
        return len(self._aliases)

    def reset(self) -> int:
        """Forget every label, alias and the bound; returns how many records went."""
        with self._lock:
            gone = reset(self._store)
        self._load()
        return gone


def reset(store: StateStore) -> int:
    """Delete everything learned in ``store`` (`meancache cache reset-learning`), in one
    transaction: labels, aliases and so the bound and the per-entry evidence they carry."""
    return store.delete_states(PREFIX)


def labelled_questions(store: StateStore) -> list[Label]:
    """The newest ``KEPT`` labels that hold their question (labels written before they
    kept it do not): federated learning trains the verifier on them, wrong ones included."""
    labels = [Label(**record) for _, chunk in _chunks(store) for record in chunk][-KEPT:]
    return [label for label in labels if label.question and label.entry]


def _chunks(store: StateStore) -> list[tuple[str, Any]]:
    chunks = store.states(_LABELS)
    return sorted(chunks.items(), key=lambda item: int(item[0][len(_LABELS):]))


def send_evidence(store: StateStore, judge: str) -> BoundEvidence:
    """The labels in ``store`` (the newest ``KEPT``, which the bound rests on) that
    ``judge`` scored, as the bound evidence federated learning sends for the pool of that
    judge (shared.fl.bound_evidence: sums per score bin, no text, no entry; a label that
    names no judge, or another, is not sent: its score is on an unknown scale), marked as
    sent: from now on the bound merges the pooled evidence with the labels learned after
    these only."""
    everything = [Label(**record) for _, chunk in _chunks(store) for record in chunk]
    labels = [label for label in everything[-KEPT:] if judge and label.judge == judge]
    store.set_states({_SENT: len(everything)})
    return _sums(labels, np.array([label.score for label in labels], dtype=float))


def send_rescored(store: StateStore, labels: list[Label], scores: np.ndarray
                  ) -> BoundEvidence:
    """``labels`` (of ``labelled_questions(store)``) at the ``scores`` another judge gave
    them (federated learning's evidence round: the final global model's; NaN: a label
    that judge would not have made, left out), as ``send_evidence`` sends a judge's own,
    marked as sent alike."""
    store.set_states({_SENT: sum(len(chunk) for _, chunk in _chunks(store))})
    scores = np.asarray(scores, dtype=float)
    kept = ~np.isnan(scores)
    return _sums([label for label, keep in zip(labels, kept, strict=True) if keep],
                 scores[kept])


def _sums(labels: list[Label], scores: np.ndarray) -> BoundEvidence:
    return BoundEvidence.of_labels(
        scores, np.array([label.wrong for label in labels], dtype=float),
        1.0 / np.clip([label.labelled_with for label in labels], 1e-3, 1.0))


def pools(store: StateStore) -> tuple[BoundEvidence, ...]:
    """The pooled bound evidence installed in ``store``, a pool per judge that holds
    labels; one that does not read as valid evidence counts as none (it was checked when
    installed)."""
    records = store.get_meta(POOLED)
    found = []
    for record in records if isinstance(records, list) else [records]:
        try:
            found.append(BoundEvidence.from_record(record))
        except ValueError:
            continue
    return tuple(pool for pool in found if pool.labels)


def pooled(store: StateStore, judge: str | None = None) -> BoundEvidence:
    """The pool installed in ``store`` that names ``judge`` (None: the first installed,
    the verifier's where a global model's two pools both hold labels), or none."""
    return next((pool for pool in pools(store) if judge is None or pool.judge == judge),
                BoundEvidence.empty())


def record_learning_mode(store: StateStore, learns: bool) -> None:
    store.set_states({LEARNS_FROM_ANSWERS: learns})


def recorded_learning_mode(store: StateStore, unrecorded: bool) -> bool:
    """Whether the cache that last faced traffic on ``store`` learned from the upstream's
    answers; ``unrecorded`` where none has said yet (a store from before it was recorded:
    the device's settings then)."""
    return bool(store.get_meta(LEARNS_FROM_ANSWERS, unrecorded))


def set_pooled(store: StateStore, *evidence: BoundEvidence) -> str:
    """Install the bound evidence of a verified global model (client.fl.device: its
    verifier's pool and its cosine's), replacing what was installed, with a new version,
    which it returns: an open cache on ``store`` reads it at its next bound
    (``Learned._follow_pool``)."""
    version = uuid.uuid4().hex
    store.set_states({POOLED: [pool.to_record() for pool in evidence if pool.labels],
                      POOLED_VERSION: version})
    return version


def aliases(store: StateStore) -> dict[str, str]:
    """Every alias kept in ``store``: the normalised question and the entry it was
    confirmed to share an answer with (federated learning trains the verifier on them)."""
    return {name[len(_ALIAS):]: entry_id for name, entry_id in store.states(_ALIAS).items()
            if entry_id is not None}
