"""What the cache's operations return."""

from dataclasses import dataclass, field

from meancache.client.matching.origins import CacheOrigin, Source


@dataclass(frozen=True)
class Hit:
    """A cached answer served for ``query``; pass its origin to ``reject`` if it was wrong."""

    query: str
    answer: str
    matched_query: str
    similarity: float
    entry_id: str
    source: Source
    hit_id: str
    truncated: bool = False

    @property
    def origin(self) -> CacheOrigin:
        """What a turn answered by this hit records, and what ``reject`` takes."""
        return CacheOrigin(self.hit_id, self.entry_id, self.matched_query, self.similarity)


@dataclass(frozen=True)
class Miss:
    query: str
    reason: str
    best_similarity: float | None = None
    truncated: bool = False
    # a near match declined (``reason`` says why): the verifier's or the rules' word, or
    # an answer longer than the asker takes
    vetoed: bool = False
    explored: bool = False  # a would-be hit also asked upstream to label it (exploration)


@dataclass(frozen=True)
class CacheStats:
    entries: int
    bytes: int
    stale_entries: int
    hits: int
    misses: int
    rejections: int
    evictions: int
    tokens_saved: int
    threshold: float
    global_threshold: float
    local_threshold: float | None
    labelled_positives: int
    labelled_negatives: int
    encoder_version: str
    encoder_backend: str
    embedding_dim: int
    bytes_per_embedding: int
    tokens_upstream: int = 0  # query + answer tokens of the answers the upstream gave
    declines: dict[str, int] = field(default_factory=dict)  # near matches vetoed, by reason
    explored: int = 0  # would-be hits also asked upstream (exploration), counted as misses
    # The learned error bound (client/learning/bound.py): the estimated share of served
    # answers that are wrong, its 95% upper limit, the labels behind it, the bound set.
    wrong_rate: float | None = None
    wrong_rate_upper: float | None = None
    wrong_rate_labels: int = 0
    # of those labels, not this device's: pooled from other devices (FL) and the judge's
    # own (the learned decision's card ships its choose splits' labels)
    wrong_rate_pooled: int = 0
    max_wrong_rate: float | None = None
    # Until the labels choose the threshold (the verifier's own serves meanwhile): the
    # fewest labels, none wrong, with which they can (bound.labels_needed).
    wrong_rate_needs: int | None = None
    # whether the traffic's labels come from the upstream's answers too, or from "wrong
    # answer" alone (the setting learn_from_answers)
    learns_from_answers: bool = True
    # The judge's score from which the bound serves; None where it serves no score (no
    # region backed, or the labels refused it: ``wrong_rate_lower`` is then their lower
    # limit, over the rate) or where no bound is kept.
    serves_from: float | None = None
    wrong_rate_lower: float | None = None
    closed: bool = False  # no score served: only repeats and confirmed rewordings
    # The exploration's warm-up (client/learning/explore.py): the matches it checks first
    # (0: none), and this device's labels over the threshold: how many, how many wrong,
    # and whether they are within the rate (the warm-up ends at ``warmup`` if they are).
    warmup: int = 0
    checked: int = 0
    checked_wrong: int = 0
    checked_within: bool = True

    @property
    def serves_from_line(self) -> str:
        """The judge's score from which answers are served, in one line."""
        if self.closed:
            return "none: only repeats and confirmed rewordings (see wrong answers)"
        return "-" if self.serves_from is None else f"{self.serves_from:.3f}"

    @property
    def wrong_rate_line(self) -> str:
        """The estimated wrong rate with its bound, in one line; where no score is served,
        why, and what would serve again."""
        if self.closed:
            return self._closed_line()
        if self.wrong_rate is None or self.wrong_rate_upper is None:
            return "not estimated yet (no labels over the judge's threshold)"
        bound = "" if self.max_wrong_rate is None else f", bound {self.max_wrong_rate:.1%}"
        needs = "" if self.wrong_rate_needs is None else \
            f"; the labels decide from {self.wrong_rate_needs}"
        pooled = "" if not self.wrong_rate_pooled else (
            f" ({self.wrong_rate_pooled} of them not this device's: the judge's card's and "
            "other devices')")
        return (f"{self.wrong_rate:.1%} (at most {self.wrong_rate_upper:.1%} at 95%, "
                f"{self.wrong_rate_labels} labels{pooled}{bound}{needs})")

    def _closed_line(self) -> str:
        rate = "the bound" if self.max_wrong_rate is None else f"{self.max_wrong_rate:.1%}"
        served = "nothing is served by similarity, only repeats and confirmed rewordings"
        if self.wrong_rate is None or self.wrong_rate_upper is None:
            needs = "" if self.wrong_rate_needs is None else \
                f", until {self.wrong_rate_needs} labels, none wrong, back a region"
            return f"no region backed at {rate} yet: {served}{needs}"
        labels = f"{self.wrong_rate_labels} labels" + (
            f", {self.wrong_rate_pooled} not this device's" if self.wrong_rate_pooled else "")
        if self.wrong_rate_lower is None:  # no region passed the test
            shown = (f"the labels back no region at {rate}: at the highest scores they test, "
                     f"{self.wrong_rate:.1%} wrong, up to {self.wrong_rate_upper:.1%} at 95% "
                     f"({labels})")
        else:  # this device's labels refused the region
            shown = (f"this device's labels show {self.wrong_rate:.1%} wrong, at least "
                     f"{self.wrong_rate_lower:.1%} at 95% ({labels}): over {rate}")
        return (f"{shown}; so {served}, until the labels back a region (raise "
                "max_wrong_rate, or `meancache cache reset-learning` to start over)")

    @property
    def warmup_line(self) -> str:
        """Whether the warm-up still checks every match, and why, in one line."""
        if not self.warmup:
            return "off (nothing is explored: exploration off, or no upstream compared)"
        if self.closed:
            return "- (nothing is served by similarity: above)"
        counted = f"{self.checked} checked, {self.checked_wrong} wrong"
        if self.checked < self.warmup:
            return (f"on: every match is checked against a fresh answer until "
                    f"{self.warmup} are ({counted})")
        if not self.checked_within:
            rate = "the bound" if self.max_wrong_rate is None else f"{self.max_wrong_rate:.1%}"
            return (f"on: {counted}, over {rate}: every match is still checked until "
                    "they are within it or refuse the region")
        return f"done ({counted})"

    @property
    def labels_line(self) -> str:
        """Where the traffic's labels come from, in one line."""
        if self.learns_from_answers:
            return "the upstream's answers (declined and explored candidates) and 'wrong answer'"
        return ("'wrong answer' only: the upstream's answers are not compared "
                "(learn_from_answers; off with the embedded demo model)")

    @property
    def hit_rate_line(self) -> str:
        """The hit rate with its counts, and what exploration asked upstream."""
        explored = f", {self.explored} of them explored" if self.explored else ""
        hits = f"{self.hits} hit" + ("" if self.hits == 1 else "s")
        misses = f"{self.misses} miss" + ("" if self.misses == 1 else "es")
        return f"{self.hit_rate:.1%} ({hits}, {misses}{explored})"

    @property
    def declines_line(self) -> str:
        """The declined near matches in one line, most frequent reason first."""
        if not self.declines:
            return "none"
        ranked = sorted(self.declines.items(), key=lambda item: (-item[1], item[0]))
        return f"{sum(self.declines.values())} (" + "; ".join(
            f"{count} {reason}" for reason, count in ranked) + ")"

    @property
    def hit_rate(self) -> float:
        asked = self.hits + self.misses
        return self.hits / asked if asked else 0.0

    @property
    def token_saving_ratio(self) -> float:
        """SCALM's metric: the share of all answered tokens that cache hits served."""
        answered = self.tokens_saved + self.tokens_upstream
        return self.tokens_saved / answered if answered else 0.0

    @property
    def rows(self) -> list[tuple[str, str]]:
        """The statistics as a person reads them, each fact once: the stats screen's rows
        and `meancache cache stats`' table (``--json`` gives the fields themselves)."""
        local = "-" if self.local_threshold is None else f"{self.local_threshold:.3f}"
        return [
            ("hit rate", self.hit_rate_line),
            ("wrong answers (estimated)", self.wrong_rate_line),
            ("served from (judge's score)", self.serves_from_line),
            ("matches checked first (warm-up)", self.warmup_line),
            ("labels from", self.labels_line),
            ("false hits (rejected)", str(self.rejections)),
            ("near matches declined", self.declines_line),
            ("tokens saved", str(self.tokens_saved)),
            ("token saving ratio", f"{self.token_saving_ratio:.1%} of "
                                   f"{self.tokens_saved + self.tokens_upstream} answered tokens"),
            ("similarity threshold (tau)", f"{self.threshold:.3f}"),
            ("local threshold", local),
            ("global threshold", f"{self.global_threshold:.3f}"),
            ("labelled pairs", f"{self.labelled_positives} accepted, "
                               f"{self.labelled_negatives} rejected"),
            ("entries", str(self.entries)),
            *([("stale entries", f"{self.stale_entries} (stored under another encoder: "
                                 "re-embedded at the next start)")]
              if self.stale_entries else []),
            ("evicted", str(self.evictions)),
            ("bytes", f"{self.bytes:,}"),
            ("encoder version", f"{self.encoder_version} ({self.encoder_backend}, "
                                f"{self.embedding_dim} dims)" if self.embedding_dim else
             f"- ({self.encoder_backend}; no vectors stored yet)"),
        ]
