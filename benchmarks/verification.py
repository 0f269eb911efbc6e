"""Which candidate the cache serves: precision against cache-hit ratio over the thresholds
(the curve the Redis LangCache paper proposes, with the area under it) for four deciders:

- embedding only: the most similar stored question is served if its cosine >= t;
- rules: the same, unless the rule verifier (``client.matching.rules``, every check)
  vetoes it (a veto is a miss, as in the client);
- learned model alone: the candidates at cosine >= the recall tau (tau - ``RECALL_MARGIN``,
  at most ``VERIFIED_AT_MOST``) are scored by the learned verifier, each pair alone; the most
  probable one is served if its probability >= t;
- the client's decision (``Matcher.decide`` itself, ``verifier = "learned"`` and
  ``--decision``, the settings' default "learned"): the learned decision's card
  (shared/verifier/decision.py) serves the model's pick from its features, the rule checks
  the card keeps (``rules.WITH_LEARNED``) vetoing; with another encoder or verifier than
  the card's, or ``--decision rules``, the pick is served if it alone reaches the
  verifier's threshold (``matcher.ambiguous``) and the kept checks pass it. Its curve
  moves the card's threshold: each question's score is the card's
  (``LearnedDecision.serves``) where ``Matcher.decide`` serves the pick with the
  threshold at 0, checked against what it serves at the card's threshold; with the
  rules decision, the pick's probability cut above the verifier's threshold (the
  ambiguity rule judged there).
``--verifier`` picks which of them to run (none = embedding only, model = the learned
model alone; default: all four). A table per rule check says what it vetoes among the
pairs the model alone serves: the evidence for ``WITH_LEARNED``.

Data, none of it used to train the verifier or choose its threshold except dev-a:
1. QQP dev, split by a hash of each pair into dev-a (where the shipped verifier threshold
   was chosen, F0.5, and the kept rule checks) and dev-b (never used for any choice):
   stored q1, asked q2; dev-b again balanced as MeanCache's own QQP test set is (every
   duplicate and as many non-duplicates, drawn by --seed).
2. benchmarks/data/near_miss_heldout.jsonl: 206 near-misses and 208 paraphrases written
   for this benchmark (never trained or tuned on); beside it tests/data/near_miss.jsonl,
   the set the rules' word lists were tuned on and the kept checks were chosen on.
3. the contextual sets' standalone and follow-up questions (unique_u0/u1): every question
   asked of a cache holding all the others; none is a duplicate, so every hit is wrong.
4. a replay of QQP dev duplicates, one per half (dev-a: where the decision rule was
   chosen; dev-b: reported only): every q1 of the half stored (1,407 / 1,439), the q2 of
   --replay duplicates of the half asked against all of them (top --k by cosine), as
   benchmarks/decision_study.py replays them: right = its own q1 served. Beside it
   the precision counting as right any stored question QQP itself links to the asked one
   (the same text, or joined through duplicate-labelled pairs of train and dev): a
   duplicate of another pair is the same question, not a wrong answer.
Each table row gives the operating point the client ships (tau, the card's threshold)
with precision, hit ratio (served / asked), recall (right / answerable) and F0.5, and the
area under the whole curve. Lookup latency: p50/p99 of ``SemanticCache.lookup`` at
--entries entries (real QQP questions) with each chosen verifier, interleaved query by
query: embedding the question with each of --latency-backends, the decision (its vector
memoised) and the whole lookup (the two added question by question).

Run from the repository root (QQP embeddings are cached under --cache-dir):

    python benchmarks/verification.py --plot docs/verification.png
    python benchmarks/verification.py --quick
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
from _common import (
    REPO_ROOT,
    Latency,
    apply_defaults,
    base_parser,
    embed_cached,
    first_threshold,
    fmt,
    heading,
    load_encoder,
    load_json,
    load_qqp,
    machine_load,
    make_table,
    note,
    pct,
    print_command,
    print_table,
    qqp_questions,
    sample,
    unique,
)
from _plot import add_plot_option, line_chart
from meancache.client.cache import CacheSettings, Context, SemanticCache
from meancache.client.cache.entry import STORED_DTYPE, Entry
from meancache.client.cache.store import EntryStore
from meancache.client.cache.threshold import ThresholdState
from meancache.client.matching.matcher import (
    VERIFIED_AT_MOST,
    Match,
    Matcher,
    ambiguous,
    learned_decision,
)
from meancache.client.matching.question import Candidate, Question
from meancache.client.matching.rules import CHECKS, WITH_LEARNED, verify
from meancache.client.matching.settings import DECISIONS, RECALL_MARGIN
from meancache.shared.encoder import BACKENDS, Encoder, profile_threshold
from meancache.shared.jsonl import jsonl_lines
from meancache.shared.pairs import Pair
from meancache.shared.query import embedding_text
from meancache.shared.verifier.decision import LearnedDecision
from meancache.shared.verifier.runtime import Card, LearnedVerifier
from meancache.shared.verifier.train import dev_half

NEAR_MISS = REPO_ROOT / "benchmarks" / "data" / "near_miss_heldout.jsonl"
RULES_NEAR_MISS = REPO_ROOT / "tests" / "data" / "near_miss.jsonl"  # the rules' tuning set
HELD_OUT, TUNING = "near-miss (held out)", "near-miss (rules' tuning set)"
BALANCED = "QQP dev-b balanced"
REPLAY = "replay QQP {half}"  # one replay per dev half
CHOSEN_ON = ("QQP dev-a", TUNING, REPLAY.format(half="dev-a"))  # sets choices were made on
MODEL, LEARNED = "learned model alone", "Matcher.decide"
# --verifier: the decider each choice runs; "model" is no client setting (no latency row).
DECIDERS = {"none": "embedding only", "rules": "rules", "model": MODEL, "learned": LEARNED}


@dataclass(frozen=True)
class Asked:
    """One question asked of a cache: its candidates (most similar first), which of them
    would be a right answer, and whether any is (answerable)."""

    query: str
    texts: list[str]
    cosines: np.ndarray
    right: np.ndarray  # bool per candidate
    linked: np.ndarray | None = None  # bool per candidate: QQP links it (replays only)


@dataclass(frozen=True)
class Served:
    """Per question: the score the decider serves at (served iff score >= t) and whether
    what it serves is right."""

    scores: np.ndarray
    right: np.ndarray
    answerable: int
    linked: np.ndarray | None = None  # what it serves is linked to the question (replays)


def pairs_as_asked(pairs: Sequence[tuple[str, str, int]], a: np.ndarray, b: np.ndarray
                   ) -> list[Asked]:
    """A stored q1 and an asked q2 per pair: one candidate each."""
    return [Asked(q2, [q1], np.array([float(va @ vb)]), np.array([label == 1]))
            for (q1, q2, label), va, vb in zip(pairs, a, b, strict=True)]


def retrieval_as_asked(queries: list[str], qv: np.ndarray, stored: list[str], sv: np.ndarray,
                       own: list[int | None], k: int,
                       links: dict[str, str] | None = None) -> list[Asked]:
    """Each query against every stored question, its top ``k`` by cosine; ``links`` (a
    question's group of QQP-linked questions, ``linked_groups``) marks the linked ones."""
    sims = qv @ sv.T
    out = []
    for i, query in enumerate(queries):
        top = np.argsort(-sims[i])[:k]
        linked = None if links is None else np.array(
            [same_group(links, query, stored[j]) for j in top])
        out.append(Asked(query, [stored[j] for j in top], sims[i, top],
                         np.array([own[i] == j for j in top]), linked))
    return out


@dataclass(frozen=True)
class Pick:
    """The candidate the learned model would serve (None: no candidate reaches the recall
    tau), its probability, and whether another candidate reaches the card's threshold too
    (``matcher.ambiguous``: a miss in the client's decision)."""

    index: int | None
    probability: float
    ambiguous: bool = False
    # The client's decision (``Matcher.decide``): the candidate it serves at some threshold
    # of its card and the score it serves from (-inf: none; ``Shipped.score``).
    served: int | None = None
    score: float = -np.inf


Chosen = list[Pick]  # per question


def decide(asked: list[Asked], system: str, chosen: Chosen | None = None) -> Served:
    """What ``system`` serves; the learned ones need the model's ``chosen`` candidates."""
    scores, right = np.full(len(asked), -np.inf), np.zeros(len(asked), dtype=bool)
    served_at: list[int | None] = [None] * len(asked)
    if system == MODEL:
        assert chosen is not None
        for i, pick in enumerate(chosen):
            if (j := pick.index) is not None:
                scores[i], right[i], served_at[i] = pick.probability, asked[i].right[j], j
    elif system == LEARNED:
        assert chosen is not None
        for i, pick in enumerate(chosen):
            if (j := pick.served) is not None:
                scores[i], right[i], served_at[i] = pick.score, asked[i].right[j], j
    else:
        for i, a in enumerate(asked):
            if system == "rules" and verify(a.query, a.texts[0]) is not None:
                continue
            scores[i], right[i], served_at[i] = a.cosines[0], a.right[0], 0
    linked = None
    if asked and asked[0].linked is not None:
        linked = np.array([j is not None and bool(a.linked[j])  # type: ignore[index]
                           for a, j in zip(asked, served_at, strict=True)])
    return Served(scores, right, int(sum(a.right.any() for a in asked)), linked)


@dataclass
class Remembered:
    """The shipped verifier with each pair's probability remembered: the learned model
    alone and ``Matcher.decide`` (at every threshold of its sweep) read the same scores,
    each pair scored once and alone, as the client scores it."""

    verifier: LearnedVerifier
    memo: dict[tuple[str, str], float] = field(default_factory=dict)

    @property
    def card(self) -> Card:  # what a decision card names
        return self.verifier.card

    @property
    def threshold(self) -> float:
        return self.verifier.threshold

    def probabilities(self, query: str, candidates: Sequence[str]) -> np.ndarray:
        missing = [c for c in dict.fromkeys(candidates) if (query, c) not in self.memo]
        if missing:
            for text, p in zip(missing, self.verifier.probabilities(query, missing),
                               strict=True):
                self.memo[(query, text)] = float(p)
        return np.array([self.memo[(query, c)] for c in candidates], dtype=np.float32)


@dataclass
class Shipped:
    """``Matcher.decide`` as the client runs it (``--decision``), on a scratch store, at
    tau; with the learned decision's threshold moved where asked (the shipped card with
    only its threshold changed)."""

    encoder: Encoder
    tau: float
    decision: str
    verifier: Remembered
    directory: Path
    matchers: dict[float, Matcher] = field(default_factory=dict)
    stores: list[EntryStore] = field(default_factory=list)
    first: float | None = None  # where a new device's bound starts

    @property
    def card(self) -> LearnedDecision:
        """The shipped card at the threshold a new device serves from: where the bound on
        the card's own labels starts (client/learning/state.py), at the default
        ``max_wrong_rate``."""
        card = learned_decision()
        if self.first is None:
            self.first = first_threshold(card)
        return replace(card, threshold=self.first)

    def matcher(self, threshold: float | None = None) -> Matcher:
        """The client's matcher; ``threshold`` moves the learned decision's."""
        key = self.card.threshold if threshold is None else float(threshold)
        if key not in self.matchers:
            store = EntryStore(self.directory / f"matcher-{len(self.matchers)}")
            self.stores.append(store)
            settings = CacheSettings(global_threshold=self.tau, verifier="learned",
                                     decision=self.decision).matching
            self.matchers[key] = Matcher(self.encoder, ThresholdState(store, self.tau),
                                         store, settings, self.verifier,
                                         replace(self.card, threshold=key))
        return self.matchers[key]

    def serves(self, asked: Asked, threshold: float | None = None) -> int | None:
        """The candidate ``Matcher.decide`` serves for ``asked`` (None: a miss). It reads
        no vector: the candidates come with their cosines."""
        matcher = self.matcher(threshold)
        question = Question(asked.query, embedding_text(asked.query), np.empty(0),
                            self.encoder.is_truncated(asked.query))
        decision = matcher.decide(question, [Candidate(str(j), text, float(c)) for j, (text, c)
                                             in enumerate(zip(asked.texts, asked.cosines,
                                                              strict=True))])
        return int(decision.candidate.key) if isinstance(decision, Match) else None

    def learned(self) -> bool:
        """Whether the learned decision decides (the settings choose it and its card fits
        this encoder and verifier); else the rules decide."""
        return self.matcher().decision_card() is not None

    def close(self) -> None:
        for store in self.stores:
            store.close()

    def score(self, asked: Asked, counting: list[int], probabilities: np.ndarray | None
              ) -> tuple[int | None, float]:
        """(the candidate ``Matcher.decide`` serves at some threshold, the score from which
        it serves it; None, -inf: at none): with the learned decision, the pick it serves
        with the card's threshold at 0 and the card's score (``LearnedDecision.serves`` on
        the counting candidates, as the matcher calls it), checked against what it serves
        at the card's own threshold; the very same question 1.0; with the rules deciding,
        what it serves and the pick's probability (the curve above the operating point)."""
        served = self.serves(asked)
        if probabilities is None:  # the very same question, or nothing counting
            return served, 1.0 if served is not None else -np.inf
        if not self.learned():
            return served, float(probabilities.max()) if served is not None else -np.inf
        anywhere = self.serves(asked, 0.0)
        score = -np.inf if anywhere is None else self.card.serves(
            [float(asked.cosines[j]) for j in counting], probabilities,
            self.matcher().recall_tau, self.verifier.threshold)[1]
        if (served is not None) != (score >= self.card.threshold) \
                or served not in (None, anywhere):
            raise SystemExit(f"Matcher.decide and the card's score disagree on "
                             f"{asked.query!r} (score {score:.4f}): a bug here")
        return anywhere, score


def most_probable(asked: list[Asked], recall_tau: float, shipped: Shipped) -> Chosen:
    """Per question, the candidate the learned model would serve, its candidates scored as
    the client scores them (each pair alone); the very same question passes by identity
    (1.0, unscored, never ambiguous), as in the client. Beside it what ``Matcher.decide``
    serves and from which score (``Shipped.score``)."""
    verifier, chosen = shipped.verifier, []
    for a in asked:
        counting = [j for j in range(min(len(a.texts), VERIFIED_AT_MOST))
                    if a.cosines[j] >= recall_tau]
        same = [j for j in counting if embedding_text(a.texts[j]) == embedding_text(a.query)]
        probabilities = None
        if not counting or same:
            pick = Pick(same[0], 1.0) if same else Pick(None, -np.inf)
        else:
            probabilities = verifier.probabilities(a.query, [a.texts[j] for j in counting])
            top = int(np.argmax(probabilities))
            pick = Pick(counting[top], float(probabilities[top]),
                        ambiguous(probabilities, verifier.threshold))
        served, score = shipped.score(a, counting, probabilities)
        chosen.append(replace(pick, served=served, score=score))
    return chosen


def kept_rule_vetoes(asked: Asked, j: int, checks: tuple[str, ...] = WITH_LEARNED) -> bool:
    """Whether ``checks`` veto serving candidate ``j`` (never the very same question)."""
    if embedding_text(asked.texts[j]) == embedding_text(asked.query):
        return False
    return verify(asked.query, asked.texts[j], checks) is not None


@dataclass(frozen=True)
class Point:
    threshold: float
    precision: float
    hit_ratio: float
    recall: float
    f05: float


def at(served: Served, t: float) -> Point:
    hit = served.scores >= t
    n_hit, n_right = int(hit.sum()), int((hit & served.right).sum())
    precision = n_right / n_hit if n_hit else 1.0
    recall = n_right / served.answerable if served.answerable else 0.0
    f05 = 1.25 * precision * recall / (0.25 * precision + recall) if n_right else 0.0
    return Point(t, precision, n_hit / len(served.scores), recall, f05)


def curve(served: Served) -> tuple[np.ndarray, np.ndarray, float]:
    """Hit ratio and precision at every cut, and the area under precision(hit ratio)."""
    finite = np.isfinite(served.scores)
    order = np.argsort(-served.scores[finite], kind="stable")
    right = served.right[finite][order]
    hits = np.arange(1, len(right) + 1)
    ratio = hits / len(served.scores)
    precision = np.cumsum(right) / hits
    if len(ratio) == 0:
        return ratio, precision, 0.0
    area = float(np.trapezoid(np.r_[precision[0], precision], np.r_[0.0, ratio]))
    return ratio, precision, area


def linked_precision(served: Served, point: Point) -> str:
    """Hit precision at ``point`` counting QQP-linked stored questions as right (replays;
    "-" elsewhere)."""
    if served.linked is None:
        return "-"
    hit = served.scores >= point.threshold
    return pct(float(served.linked[hit].mean())) if hit.any() else "-"


def operating_points(tau: float, shipped: Shipped | None) -> dict[str, float]:
    """Where each decider ships: tau, the verifier's threshold, and the client's decision
    at its card's threshold (the learned decision) or the verifier's (the rules)."""
    if shipped is None:
        return {"embedding only": tau, "rules": tau, MODEL: np.nan, LEARNED: np.nan}
    model = shipped.verifier.threshold
    return {"embedding only": tau, "rules": tau, MODEL: model,
            LEARNED: shipped.card.threshold if shipped.learned() else model}


# data ---------------------------------------------------------------------------------
def near_miss_rows(path: Path = NEAR_MISS) -> list[dict]:
    return [json.loads(line) for _, line in jsonl_lines(path.read_text(encoding="utf-8"))]


def balanced(pairs: list[tuple[str, str, int]], seed: int) -> list[tuple[str, str, int]]:
    """Every duplicate of ``pairs`` and as many of its non-duplicates, drawn by ``seed``:
    the form of MeanCache's own QQP test set (half of it duplicates), on which the issue
    checks the whole decision's F0.5; a share of duplicates moves precision and F0.5."""
    duplicates = [p for p in pairs if p[2] == 1]
    others = [p for p in pairs if p[2] != 1]
    return duplicates + sample(others, len(duplicates), seed)


def pair_sets(args: argparse.Namespace, encoder: Encoder) -> dict[str, list[Asked]]:
    dev = sample(load_qqp(args.data_dir, "dev"), args.dev_pairs, args.seed)
    sets: dict[str, list[tuple[str, str, int]]] = {"QQP dev-a": [], "QQP dev-b": []}
    for p in dev:
        half = dev_half(Pair(p.q1.strip(), p.q2.strip(), p.label))  # as read_pairs reads it
        sets[f"QQP {half}"].append((p.q1, p.q2, p.label))
    sets[BALANCED] = balanced(sets["QQP dev-b"], args.seed)
    for name, path in ((HELD_OUT, NEAR_MISS), (TUNING, RULES_NEAR_MISS)):
        sets[name] = [(r["q1"], r["q2"], r["label"]) for r in near_miss_rows(path)]
    out = {}
    for name, pairs in sets.items():
        a = embed_cached(encoder, [embedding_text(p[0]) for p in pairs], args.cache_dir)
        b = embed_cached(encoder, [embedding_text(p[1]) for p in pairs], args.cache_dir)
        out[name] = pairs_as_asked(pairs, a, b)
    return out


def contextual_set(args: argparse.Namespace, encoder: Encoder) -> list[Asked]:
    folder = args.data_dir / "contextual"
    texts = unique(q for name in ("unique_u0.json", "unique_u1.json")
                   for q in load_json(folder / name) if isinstance(q, str) and q.strip())
    vectors = embed_cached(encoder, [embedding_text(t) for t in texts], args.cache_dir)
    asked = []
    for i, text in enumerate(texts):  # the others stored: none answers it
        others = [j for j in range(len(texts)) if j != i]
        asked += retrieval_as_asked([text], vectors[i:i + 1], [texts[j] for j in others],
                                    vectors[others], [None], args.k)
    return asked


def linked_groups(data_dir: Path) -> dict[str, str]:
    """Each QQP question (as embedded) to one question of its group: those joined through
    duplicate-labelled pairs of train and dev. QQP's duplicates are one question asked in
    several words, so an asked q2 is often the duplicate of another pair's q1 too."""
    parent: dict[str, str] = {}

    def root(text: str) -> str:
        parent.setdefault(text, text)
        while parent[text] != text:
            parent[text] = parent[parent[text]]
            text = parent[text]
        return text

    for p in load_qqp(data_dir):
        if p.label == 1:
            parent[root(embedding_text(p.q1))] = root(embedding_text(p.q2))
    return {text: root(text) for text in list(parent)}


def same_group(links: dict[str, str], a: str, b: str) -> bool:
    """The same question (as embedded), or QQP links the two (``linked_groups``)."""
    a, b = embedding_text(a), embedding_text(b)
    return a == b or (a in links and links[a] == links.get(b))


def replay_sets(args: argparse.Namespace, encoder: Encoder) -> dict[str, list[Asked]]:
    """A replay per dev half, split as the pairs are (``dev_half``)."""
    links = linked_groups(args.data_dir)
    halves: dict[str, list] = {"dev-a": [], "dev-b": []}
    for p in load_qqp(args.data_dir, "dev"):
        if p.label == 1:
            halves[dev_half(Pair(p.q1.strip(), p.q2.strip(), p.label))].append(p)
    out = {}
    for half, duplicates in halves.items():
        chosen = sample(duplicates, args.replay, args.seed)
        stored = unique(p.q1 for p in duplicates)  # every q1 of the half: a fuller cache
        index = {q: i for i, q in enumerate(stored)}
        sv = embed_cached(encoder, [embedding_text(q) for q in stored], args.cache_dir)
        qv = embed_cached(encoder, [embedding_text(p.q2) for p in chosen], args.cache_dir)
        out[REPLAY.format(half=half)] = retrieval_as_asked(
            [p.q2 for p in chosen], qv, stored, sv, [index[p.q1] for p in chosen], args.k,
            links)
    return out


# latency ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Timings:
    embedding: dict[str, Latency]  # per encoder backend: embedding one question
    decision: dict[str, Latency]  # per verifier setting: the lookup, the vector memoised
    whole: dict[tuple[str, str], Latency]  # (backend, setting): the two, question by question


def latency(args: argparse.Namespace, encoders: dict[str, Encoder]) -> Timings:
    """Lookups of QQP dev duplicates' q2 in a real cache of --entries entries: their q1
    plus QQP train questions (real neighbours, so that candidates reach the verifier as
    they would in a used cache). Question by question, interleaved so that machine load
    hits them alike: the question embedded by each backend, then the lookup under each
    verifier setting with its vector memoised (the decision). A whole lookup is a
    backend's embedding plus a setting's decision of the same question: the decision
    does not depend on the backend (the same vector space, cosine 0.9995). The cache holds
    the first backend's vectors, in the app's settings: a PCA-64 layer fitted on them and
    tau carried into its space (the decision quality above is measured in the full
    space)."""
    dev = sample([p for p in load_qqp(args.data_dir, "dev") if p.label == 1],
                 args.latency_queries + 10, args.seed + 1)
    asked = {embedding_text(p.q2) for p in dev}
    stored = unique(p.q1 for p in dev)
    neighbours = [q for q in qqp_questions(load_qqp(args.data_dir, "train"))
                  if embedding_text(q) not in asked]
    stored += sample(neighbours, max(0, args.entries - len(stored)), args.seed)
    backends = list(encoders)
    encoder = encoders[backends[0]]
    vectors = embed_cached(encoder, [embedding_text(t) for t in stored], args.cache_dir)
    settings_of = [v for v in args.verifier if v != "model"]  # the client's settings
    embedding: dict[str, list[float]] = {b: [] for b in backends}
    decision: dict[str, list[float]] = {v: [] for v in settings_of}
    with tempfile.TemporaryDirectory(prefix="meancache-verification-") as tmp:
        tau = profile_threshold(args.latency_encoder)
        settings = CacheSettings(global_threshold=tau)  # the app's: PCA-64 once fitted
        with SemanticCache(Path(tmp), encoder, settings) as cache:
            for start in range(0, len(stored), 1000):
                cache.store.put_many([
                    Entry(query=q, answer=f"answer to {q}", embedding=v.astype(STORED_DTYPE),
                          encoder_version=encoder.version, query_tokens=8, answer_tokens=8)
                    for q, v in zip(stored[start:start + 1000], vectors[start:start + 1000],
                                    strict=True)])
        with SemanticCache(Path(tmp), encoder, settings) as cache:
            cache.fit_pca()  # as the app does once a cache holds enough questions
        with SemanticCache(Path(tmp), encoder, settings) as cache:
            chosen = {v: cache.matcher.settings.model_copy(update={
                "verify_hits": v != "none", "verifier": "rules" if v == "none" else v,
                "decision": args.decision}) for v in settings_of}
            for p in dev[:10]:  # warm-up, untimed
                cache.lookup(p.q2, Context())
                for each in encoders.values():
                    each.encode([embedding_text(p.q2)])
            for p in dev[10:]:
                for backend, each in encoders.items():  # what the first lookup of p.q2 pays
                    started = time.perf_counter()
                    each.encode([embedding_text(p.q2)])
                    embedding[backend].append(time.perf_counter() - started)
                cache.lookup(p.q2, Context())  # untimed: from here the vector is memoised
                for name, match_settings in chosen.items():
                    cache.matcher.settings = match_settings
                    started = time.perf_counter()
                    cache.lookup(p.q2, Context())
                    decision[name].append(time.perf_counter() - started)
    whole = {(b, v): Latency.of(np.add(embedding[b], decision[v]))
             for b in backends for v in settings_of}
    return Timings({b: Latency.of(t) for b, t in embedding.items()},
                   {v: Latency.of(t) for v, t in decision.items()}, whole)


# report -------------------------------------------------------------------------------
def by_kind(asked: list[Asked], points: dict[str, float], chosen: Chosen | None,
            systems: list[str]) -> None:
    """Served share of the held-out near-miss set per kind, at each operating point, and
    which rule checks veto the pairs the learned model alone serves."""
    kinds = [row["kind"] for row in near_miss_rows()]
    served = {system: decide(asked, system, chosen).scores >= points[system]
              for system in systems}
    vetoes = model_vetoes(asked, chosen, points[MODEL]) if chosen else {}
    heading("held-out near-miss set: served per kind (paraphrases: hit)")
    columns = [*systems, "rule checks vetoing the model's"] if vetoes else systems
    table = make_table(["kind", "pairs", *columns])
    for kind in dict.fromkeys(kinds):
        rows = np.array([k == kind for k in kinds])
        checks = ", ".join(f"{c} {int((v & rows).sum())}" for c, v in vetoes.items()
                           if (v & rows).any())
        table.add_row(kind, str(int(rows.sum())),
                      *(pct(float(served[s][rows].mean())) for s in systems),
                      *([checks or "-"] if vetoes else []))
    near = np.array([row["label"] == 0 for row in near_miss_rows()])
    table.add_row("all near-misses", str(int(near.sum())),
                  *(pct(float(served[s][near].mean())) for s in systems),
                  *(["-"] if vetoes else []))
    print_table(table)


def model_vetoes(asked: list[Asked], chosen: Chosen, threshold: float
                 ) -> dict[str, np.ndarray]:
    """Per rule check: the questions whose candidate the learned model alone serves and
    the check alone vetoes."""
    served = [(i, pick.index) for i, pick in enumerate(chosen)
              if pick.index is not None and pick.probability >= threshold]
    out = {}
    for check in CHECKS:
        vetoed = np.zeros(len(asked), dtype=bool)
        for i, j in served:
            vetoed[i] = kept_rule_vetoes(asked[i], j, (check,))
        out[check] = vetoed
    return out


def check_table(sets: dict[str, list[Asked]], chosen: dict[str, Chosen], threshold: float
                ) -> None:
    """What each rule check, added alone after the learned model, vetoes among the pairs
    the model serves (right: a duplicate or paraphrase; wrong: not one), and its F0.5."""
    heading(f"rule checks after the learned model (kept: {', '.join(WITH_LEARNED)}; chosen "
            f"on QQP dev-a and {TUNING}): vetoes among the pairs the model serves")
    table = make_table(["data", "check", "vetoes right", "vetoes wrong", "F0.5 model",
                        "F0.5 with the check"], right_from=2)
    for name in ("QQP dev-a", "QQP dev-b", TUNING, HELD_OUT):
        asked = sets[name]
        base = decide(asked, MODEL, chosen[name])
        f05 = at(base, threshold).f05
        for check, vetoed in model_vetoes(asked, chosen[name], threshold).items():
            alone = Served(np.where(vetoed, -np.inf, base.scores), base.right & ~vetoed,
                           base.answerable)
            table.add_row(name, check, str(int((vetoed & base.right).sum())),
                          str(int((vetoed & ~base.right).sum())), fmt(f05, 4),
                          fmt(at(alone, threshold).f05, 4))
    print_table(table)


def parse_args() -> argparse.Namespace:
    parser = base_parser(__doc__)
    parser.add_argument("--encoder", default="mpnet",
                        help="mpnet (the app's default) or minilm")
    parser.add_argument("--backend", choices=BACKENDS, default="onnx-int8",
                        help="the encoder's backend for the decision quality")
    parser.add_argument("--dev-pairs", type=int, help="QQP dev pairs (default: all 9,636)")
    parser.add_argument("--replay", type=int, help="QQP dev duplicates asked per half, "
                        "every q1 of the half stored (default: all, 1,489 in dev-a and "
                        "1,516 in dev-b)")
    parser.add_argument("--k", type=int, default=VERIFIED_AT_MOST,
                        help="candidates per question in the replays")
    parser.add_argument("--entries", type=int, help="cache size for latency (default 10000)")
    parser.add_argument("--latency-encoder", default="mpnet",
                        help="the encoder of the latency table (the app's default)")
    parser.add_argument("--latency-backends", nargs="+", choices=BACKENDS,
                        default=["onnx-int8", "onnx"],
                        help="the latency encoder's backends (the first fills the cache)")
    parser.add_argument("--latency-queries", type=int, help="lookups timed per setting "
                        "(default 200)")
    parser.add_argument("--decision", choices=DECISIONS,
                        default=CacheSettings().decision, help="the client's decision "
                        "around the learned verifier (client/matching/settings.py)")
    parser.add_argument("--verifier", nargs="+", choices=list(DECIDERS),
                        default=list(DECIDERS), help="the deciders to compare: none "
                        "(embedding only), rules, model (the learned model alone), learned "
                        "(Matcher.decide with --decision; default: all four)")
    add_plot_option(parser)
    args = parser.parse_args()
    return apply_defaults(args, full={"dev_pairs": None, "replay": None, "entries": 10_000,
                                      "latency_queries": 200},
                          quick={"dev_pairs": 600, "replay": 200, "entries": 1000,
                                 "latency_queries": 20})


def main() -> None:
    args = parse_args()
    print_command()
    note(machine_load())
    encoder = load_encoder(args.backend, args.cache_dir, model=args.encoder)
    systems = [DECIDERS[v] for v in args.verifier]
    verifier = LearnedVerifier.load() if {"model", "learned"} & set(args.verifier) else None
    tau = profile_threshold(args.encoder)
    recall_tau = tau - RECALL_MARGIN
    sets = pair_sets(args, encoder)
    sets["contextual (all wrong)"] = contextual_set(args, encoder)
    sets.update(replay_sets(args, encoder))
    with tempfile.TemporaryDirectory(prefix="meancache-verification-") as tmp:
        shipped = Shipped(encoder, tau, args.decision, Remembered(verifier), Path(tmp)) \
            if verifier else None
        chosen = {name: most_probable(asked, recall_tau, shipped)
                  for name, asked in sets.items()} if shipped else {}
        points = operating_points(tau, shipped)
        deciding = "-" if shipped is None else (
            f"the learned decision from {shipped.card.threshold:.3f}, where the bound on its "
            "card's labels starts" if shipped.learned()
            else "the rules")
        if shipped is not None:
            shipped.close()
    heading(f"decision quality ({args.encoder}, tau {tau}, recall tau {recall_tau:.3f}, "
            f"verifier threshold {points[MODEL]:.3f} chosen on QQP dev-a; Matcher.decide "
            f"with decision = {args.decision!r}: {deciding}; kept rules: "
            f"{', '.join(WITH_LEARNED)})")
    table = make_table(["data", "decider", "asked", "precision", "hit ratio", "recall",
                        "F0.5", "area (precision x hit ratio)",
                        "precision, QQP-linked right"], right_from=2)
    lines = {}
    for name, asked in sets.items():
        for system in systems:
            served = decide(asked, system, chosen.get(name))
            point = at(served, points[system])
            ratio, precision, area = curve(served)
            answerable = served.answerable > 0
            table.add_row(name, system, str(len(asked)), pct(point.precision),
                          pct(point.hit_ratio), pct(point.recall) if answerable else "-",
                          fmt(point.f05) if answerable else "-",
                          fmt(area) if answerable else "-", linked_precision(served, point))
            if answerable and name not in (*CHOSEN_ON, BALANCED) and system != MODEL:
                lines[f"{name}: {system} (area {area:.3f})"] = (list(ratio), list(precision))
    print_table(table)
    by_kind(sets[HELD_OUT], points, chosen.get(HELD_OUT), systems)
    if chosen:
        check_table(sets, chosen, points[MODEL])
    if args.plot:
        line_chart(args.plot, "precision against cache-hit ratio over the thresholds",
                   "cache-hit ratio (served / asked)", "precision (right / served)",
                   {k: (v[0][::max(1, len(v[0]) // 200)], v[1][::max(1, len(v[1]) // 200)])
                    for k, v in lines.items()},
                   subtitle=f"{args.encoder}; QQP dev-b, held-out near-misses, dev-b "
                            "replay (the learned model alone is in the table)")
        note(f"wrote {args.plot}")
    heading(f"lookup latency at {args.entries:,} entries ({args.latency_encoder}, ms): "
            "embedding the question, the decision with its vector memoised, and the whole "
            "lookup (their sum per question)")
    encoders = {b: encoder if (args.latency_encoder, b) == (args.encoder, args.backend)
                else load_encoder(b, args.cache_dir, model=args.latency_encoder)
                for b in args.latency_backends}
    timings = latency(args, encoders)
    table = make_table(["encoder backend", "verifier", "lookups", "embedding p50",
                        "decision p50", "whole p50", "whole p99"], right_from=2)
    for (backend, name), full in timings.whole.items():
        table.add_row(backend, name, str(full.n), f"{timings.embedding[backend].p50:.1f}",
                      f"{timings.decision[name].p50:.1f}", f"{full.p50:.1f}",
                      f"{full.p99:.1f}")
    print_table(table)
    note(machine_load())


if __name__ == "__main__":
    main()
