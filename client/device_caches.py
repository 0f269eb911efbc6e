"""Where the device's caches live on disk, found without loading any of them (`cache list`
reads them with no model loaded): the chat's in ``settings.cache_dir``, and the proxy's
in ``DATA_DIR/proxy/NAMESPACE/PARTITION/``, each of which holds ``cache/`` (a
SemanticCache), ``exchanges/`` (client/proxy/exchanges.py) and ``preamble.json`` (the
system messages its answers were made after; client/proxy/partitions.py).

Federated learning trains on the pairs of all of them and sets the global tau of all of
them (client/fl/device.py), while a lookup only ever reads its own app's. Outside
client/proxy/, since FL (which the chat uses) must not import the proxy."""

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from meancache.client.cache.store import EntryStore
from meancache.client.config import Settings
from meancache.client.errors import EntryNotFoundError
from meancache.client.learning.bound import USER, Label
from meancache.client.learning.state import (
    aliases,
    labelled_questions,
    send_evidence,
    send_rescored,
    set_pooled,
)
from meancache.client.matching.labels import labelled_pairs
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.pairs import Pair
from meancache.shared.query import normalise_query

# The most labels a device scores anew in federated learning's evidence round: its reply
# is awaited round-timeout (600 s by default), and a label costs up to 5 pairs of the
# float global verifier and the global encoder's cosine of one pair (2 embeddings): 160 ms
# with MPNet on a free 2-core machine (benchmarks/evidence_cost.py), so these take about
# 160 s, twice that on a machine half as fast; 149 labels back a threshold at 2%.
RESCORED_LABELS = 1_000


@dataclass(frozen=True)
class Asked:
    """A label's question as a judge scores it anew: the stored questions it was weighed
    against (``Label.weighed``: the pick at ``pick``, entries gone since left out) with
    their cosines then, or its entry's question alone (``cosines`` empty: a pair the
    judge scores alone, a user's "wrong answer" or an older label)."""

    question: str
    stored: list[str]
    cosines: list[float]
    pick: int = 0


# A judge that scores labels anew: a score each, NaN where it would pick another stored
# question than the label's (the label says nothing of that one: it is not sent).
Rescore = Callable[[list[Asked]], np.ndarray]


def proxy_dir(settings: Settings) -> Path:
    return settings.data_dir / "proxy"


def cache_dirs(settings: Settings) -> Iterator[tuple[str, Path]]:
    """(namespace, cache directory) of every proxy cache on disk."""
    root = proxy_dir(settings)
    for directory in sorted(root.glob("*/*/cache")) if root.is_dir() else ():
        yield directory.parent.parent.name, directory


def device_cache_dirs(settings: Settings) -> list[tuple[str, Path]]:
    """(name, cache directory) of every cache on the device: the chat's (``chat``, whether
    or not it exists yet) first, then each proxy cache's (named by its namespace)."""
    return [("chat", settings.cache_dir), *cache_dirs(settings)]


def device_pairs(cache_dirs: Iterable[Path]) -> list[Pair]:
    """The labelled pairs of the caches in ``cache_dirs`` (none of one that does not
    exist), one cache after another, for FL: the device's own training data."""
    pairs: list[Pair] = []
    for cache_dir in cache_dirs:
        if cache_dir.exists():
            with closing(EntryStore(cache_dir)) as store:
                pairs += labelled_pairs(store)
    return pairs


def device_learned_pairs(cache_dirs: Iterable[Path]) -> list[Pair]:
    """What the caches learned from the upstream's answers (client.learning), as pairs of
    the question and its entry's question for the verifier's federated training: each
    label that kept its question (right: 1, wrong: 0; a user's "wrong answer" is among
    the feedback pairs already) and each alias. A pair whose entry is gone, or which only
    repeats its entry's question, teaches nothing and is left out; each pair comes once."""
    pairs: dict[tuple[str, str], Pair] = {}
    for cache_dir in cache_dirs:
        if not cache_dir.exists():
            continue
        with closing(EntryStore(cache_dir)) as store:
            learned = [(label.question, label.entry, int(not label.wrong))
                       for label in labelled_questions(store) if label.source != USER]
            learned += [(question, entry_id, 1) for question, entry_id in aliases(store).items()]
            for question, entry_id, same in learned:
                try:
                    stored = store.get(entry_id).query
                except EntryNotFoundError:
                    continue
                if normalise_query(stored) != question:
                    pairs.setdefault((question, stored), Pair(question, stored, same))
    return list(pairs.values())


def device_bound_evidence(cache_dirs: Iterable[Path], judges: Sequence[str]
                          ) -> list[BoundEvidence]:
    """The error-bound labels each of ``judges`` scored in the caches in ``cache_dirs``,
    summed per judge as the evidence FL sends (client.learning.state.send_evidence: each
    cache marks them sent)."""
    evidence = [BoundEvidence.empty() for _ in judges]
    for cache_dir in cache_dirs:
        if cache_dir.exists():
            with closing(EntryStore(cache_dir)) as store:
                evidence = [sums + send_evidence(store, judge)
                            for sums, judge in zip(evidence, judges, strict=True)]
    return evidence


def device_rescored_evidence(cache_dirs: Iterable[Path],
                             judges: Sequence[tuple[str, Rescore | None]],
                             most: int = RESCORED_LABELS) -> list[BoundEvidence]:
    """Each judge's error-bound evidence over the caches in ``cache_dirs``: with a
    ``Rescore``, each label that kept its question and whose entry is still there scored
    anew as it was weighed (``Asked``), whoever scored it first, and left out where the
    judge would pick another, the newest ``most`` of the device's (the first caches' go
    first); without, the labels the judge named scored (``device_bound_evidence``).
    Marked sent alike."""
    evidence = [BoundEvidence.empty() for _ in judges]
    left = most
    for cache_dir in cache_dirs:
        if not cache_dir.exists():
            continue
        with closing(EntryStore(cache_dir)) as store:
            labels, asked = _with_entries(store)
            newest = slice(len(labels) - min(left, len(labels)), None)
            labels, asked = labels[newest], asked[newest]
            left -= len(labels)
            evidence = [sums + (send_evidence(store, judge) if rescore is None else
                                send_rescored(store, labels, rescore(asked)))
                        for sums, (judge, rescore) in zip(evidence, judges, strict=True)]
    return evidence


def _with_entries(store: EntryStore) -> tuple[list[Label], list[Asked]]:
    """The labels that kept their question and whose entry is there, each as a judge
    scores it anew."""
    labels, asked = [], []
    questions: dict[str, str | None] = {}

    def stored(entry: str) -> str | None:
        if entry not in questions:
            try:
                questions[entry] = store.get(entry).query
            except EntryNotFoundError:
                questions[entry] = None
        return questions[entry]

    for label in labelled_questions(store):
        if stored(label.entry) is None:
            continue
        weighed = [(key, cosine) for key, cosine in label.weighed if stored(key) is not None]
        keys = [key for key, _ in weighed]
        labels.append(label)
        asked.append(Asked(label.question, [stored(key) or "" for key in keys],
                           [cosine for _, cosine in weighed], keys.index(label.entry))
                     if label.entry in keys else
                     Asked(label.question, [stored(label.entry) or ""], []))
    return labels, asked


def set_device_pooled(cache_dirs: Iterable[Path], *evidence: BoundEvidence) -> None:
    """The pooled bound evidence of a verified global model (a pool per judge), for every
    cache in ``cache_dirs`` (made where it does not exist yet, so a new cache starts from
    it)."""
    for cache_dir in cache_dirs:
        with closing(EntryStore(cache_dir)) as store:
            set_pooled(store, *evidence)
