"""Screening of the devices' training replies before aggregation, so that no single device
can move the global model or threshold far (a poisoned or broken device included).

A compressed reply (a quantised update, of rank-r factors where the run's update-rank
asks for them: shared.fl.compression) is first decoded into the global weights plus its
update, so everything below acts on full weights; one that does not decode (other
tensors or shapes, factors of a rank over update-rank, non-finite scales) is dropped.
A reply is dropped when its weights do not fit the global model (other names or shapes)
or hold a non-finite value, when its example count is not a finite whole number >= 0,
or when its similarity evidence (shared.fl.evidence) or its error-bound evidence
(shared.fl.bound_evidence: sums that no labels could make included) is malformed. What is
kept is then bounded:

- the example count is clamped to ``max_examples`` and to the round's median count, so no
  device weighs more than a typical one whatever it claims (with five devices, one liar
  holds at most about a fifth of the weight);
- the similarity evidence likewise, to ``max_examples`` pairs and the round's median
  number of pairs (scaled down, so its shape stays), so one device's histograms cannot
  outweigh the others' when the threshold is tuned on them;
- the error-bound evidence likewise, to ``max_examples`` labels and the round's median
  number of labels (every sum scaled alike), so one device claiming many right answers
  cannot lower every device's bound (fl_server.strategy pools the rest); the verifier's
  labels and the cosine's are two sets, each checked and capped alike;
- the update (reply weights minus the global weights sent) is scaled down to an L2 norm of
  at most ``max_update_norm`` (update clipping).

How far one round may move the threshold: fl_server.pooled_threshold.
"""

import logging
import math
from dataclasses import dataclass, field

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from meancache.shared.fl.bound_evidence import COSINE_KEYS, BoundEvidence
from meancache.shared.fl.bound_evidence import KEYS as BOUND_KEYS
from meancache.shared.fl.compression import decode_update, is_compressed
from meancache.shared.fl.evidence import Evidence

log = logging.getLogger(__name__)

COUNT_KEY = "num-examples"


@dataclass(frozen=True)
class ReplyLimits:
    """How far one device's reply may reach (run config: max-examples, max-update-norm),
    and the highest rank of a low-rank update it may send (update-rank; 0: none)."""

    max_examples: int
    max_update_norm: float
    max_update_rank: int = 0


@dataclass
class Screened:
    """The replies fit to aggregate (bounded in place), and what screening did."""

    kept: list[Message]
    evidence: list[Evidence]  # of each kept reply, bounded
    rejected: dict[int, str]  # node id -> why
    clipped_updates: int
    clamped_evidence: int
    bound: list[BoundEvidence] = field(default_factory=list)  # of each kept reply, bounded
    clamped_bound: int = 0
    cosine_bound: list[BoundEvidence] = field(default_factory=list)  # likewise, the cosine's
    clamped_cosine_bound: int = 0
    failed: dict[int, str] = field(default_factory=dict)  # node id -> its error's reason


def _metrics(message: Message) -> MetricRecord:
    return next(iter(message.content.metric_records.values()), MetricRecord())


def reject_reason(message: Message, global_arrays: ArrayRecord) -> str | None:
    """Why this reply may not be aggregated, or None when it may."""
    metrics = _metrics(message)
    count = metrics.get(COUNT_KEY)
    if (isinstance(count, bool) or not isinstance(count, int | float)
            or not math.isfinite(count) or count < 0 or count != int(count)):
        return f"'{COUNT_KEY}' must be a whole number >= 0, not {count!r}"
    try:
        Evidence.from_metrics(metrics)
    except ValueError as exc:
        return str(exc)
    reason = bound_reason(metrics)
    if reason is not None:
        return reason
    arrays = message.content.array_records.get("arrays")
    if arrays is None or set(arrays) != set(global_arrays):
        return "its weights are not the global model's (other names)"
    for name, array in arrays.items():
        if tuple(array.shape) != tuple(global_arrays[name].shape):
            return f"its weights are not the global model's ({name} has another shape)"
        if not np.isfinite(array.numpy()).all():
            return f"its weights hold non-finite values ({name})"
    return None


def bound_reason(metrics: MetricRecord) -> str | None:
    """Why a reply's error-bound evidence (the verifier's and the cosine's) may not be
    pooled, or None when it may."""
    try:
        BoundEvidence.from_metrics(metrics)
        BoundEvidence.from_metrics(metrics, COSINE_KEYS)
    except ValueError as exc:
        return str(exc)
    return None


def decompress(message: Message, global_arrays: ArrayRecord, max_rank: int) -> str | None:
    """Replace a compressed reply's update by the weights it encodes; why it cannot be
    decoded, or None."""
    arrays = message.content.array_records.get("arrays")
    if arrays is None or not is_compressed(arrays):
        return None
    try:
        decoded = decode_update({name: a.numpy() for name, a in arrays.items()},
                                {name: a.numpy() for name, a in global_arrays.items()},
                                max_rank)
    except ValueError as exc:
        return str(exc)
    message.content["arrays"] = ArrayRecord({name: Array(v) for name, v in decoded.items()})
    return None


def clip_update(arrays: ArrayRecord, global_arrays: ArrayRecord, max_norm: float
                ) -> ArrayRecord | None:
    """``arrays`` with its update from ``global_arrays`` scaled to norm ``max_norm``, or
    None when the update is within it already."""
    updates = {name: arrays[name].numpy().astype(np.float64)
               - global_arrays[name].numpy().astype(np.float64) for name in arrays}
    norm = math.sqrt(sum(float(np.square(u).sum()) for u in updates.values()))
    if norm <= max_norm:
        return None
    scale = max_norm / norm
    return ArrayRecord({
        name: Array(np.asarray(global_arrays[name].numpy() + scale * update,
                               dtype=global_arrays[name].numpy().dtype))
        for name, update in updates.items()})


def median_cap(values: list[float], limit: float) -> float:
    """``limit``, or the median of the positive values when that is lower."""
    positive = [v for v in values if v > 0]
    return min(limit, float(np.median(positive))) if positive else limit


def cap_labels(claimed: list[BoundEvidence], limit: float
               ) -> tuple[list[BoundEvidence], int]:
    """Each device's labels capped at ``limit`` and the round's median number of labels
    (every sum scaled alike), and how many were capped."""
    cap = median_cap([e.labels for e in claimed], limit)
    return [e.at_most(cap) for e in claimed], sum(e.labels > cap for e in claimed)


def capped_bounds(kept: list[Message], limit: float
                  ) -> tuple[list[BoundEvidence], int, list[BoundEvidence], int]:
    """The verifier's and the cosine's labels of each kept reply, each set capped alike
    (``cap_labels``), with how many of each were capped."""
    return (*cap_labels([BoundEvidence.from_metrics(_metrics(m)) for m in kept], limit),
            *cap_labels([BoundEvidence.from_metrics(_metrics(m), COSINE_KEYS) for m in kept],
                        limit))


def screen_evidence(replies: list[Message], limits: ReplyLimits) -> Screened:
    """An evidence round's replies (fl_server.evidence_round: sums of labels, no weights,
    no training): each reply's error-bound evidence checked as a training reply's is, a
    reply holding anything else dropped, and the labels capped alike."""
    kept: list[Message] = []
    rejected: dict[int, str] = {}
    for message in replies:
        if message.has_error():
            continue
        metrics = _metrics(message)
        extra = sorted(set(metrics) - set(BOUND_KEYS) - set(COSINE_KEYS))
        reason = (f"an evidence reply holds only bound evidence, not {extra}" if extra
                  or message.content.array_records else bound_reason(metrics))
        if reason is None:
            kept.append(message)
        else:
            rejected[message.metadata.src_node_id] = reason
            log.warning("rejected the evidence of node %d: %s",
                        message.metadata.src_node_id, reason)
    bound, clamped_bound, cosine, clamped_cosine = capped_bounds(kept, limits.max_examples)
    return Screened(kept, [], rejected, 0, 0, bound, clamped_bound, cosine, clamped_cosine)


def failure(message: Message) -> str:
    """A failed device's error, in one line: Flower sends the ClientApp's exception whole."""
    lines = [line for line in message.error.reason.splitlines() if line.strip()]
    return (lines[-1] if lines else f"error code {message.error.code}")[:300]


def screen(replies: list[Message], global_arrays: ArrayRecord, limits: ReplyLimits
           ) -> Screened:
    """Drop the unfit replies and bound the rest (their content is changed in place). A
    device whose training failed is named with its error, never dropped unsaid."""
    kept: list[Message] = []
    rejected: dict[int, str] = {}
    failed: dict[int, str] = {}
    for message in replies:
        if message.has_error():
            failed[message.metadata.src_node_id] = failure(message)
            log.warning("node %d failed its round: %s", message.metadata.src_node_id,
                        failed[message.metadata.src_node_id])
            continue
        reason = (decompress(message, global_arrays, limits.max_update_rank)
                  or reject_reason(message, global_arrays))
        if reason is None:
            kept.append(message)
        else:
            rejected[message.metadata.src_node_id] = reason
            log.warning("rejected the reply of node %d: %s", message.metadata.src_node_id,
                        reason)
    counts = [float(_metrics(m)[COUNT_KEY]) for m in kept]
    cap = median_cap(counts, limits.max_examples)
    claimed = [Evidence.from_metrics(_metrics(m)) for m in kept]
    pairs_cap = median_cap([e.pairs for e in claimed], limits.max_examples)
    evidence = [e.at_most(pairs_cap) for e in claimed]
    clamped_evidence = sum(e.pairs > pairs_cap for e in claimed)
    bound, clamped_bound, cosine, clamped_cosine = capped_bounds(kept, limits.max_examples)
    clipped_updates = 0
    for message, count in zip(kept, counts, strict=True):
        _metrics(message)[COUNT_KEY] = int(min(count, cap))
        bounded = clip_update(message.content["arrays"], global_arrays,
                              limits.max_update_norm)
        if bounded is not None:
            message.content["arrays"] = bounded
            clipped_updates += 1
    return Screened(kept, evidence, rejected, clipped_updates, clamped_evidence, bound,
                    clamped_bound, cosine, clamped_cosine, failed)
