"""Screening of the devices' training replies before aggregation, so that no single device
can move the global model or threshold far (a poisoned or broken device included).

A reply is dropped when its weights do not fit the global model (other names or shapes)
or hold a non-finite value, when its example count is not a finite whole number >= 0, or
when its threshold is not a valid one (``shared.threshold.check_threshold``). What is kept
is then bounded:

- the example count is clamped to ``max_examples`` and to the round's median count, so no
  device weighs more than a typical one whatever it claims (with five devices, one liar
  holds at most about a fifth of the weight);
- the update (reply weights minus the global weights sent) is scaled down to an L2 norm of
  at most ``max_update_norm`` (update clipping);
- the threshold is clipped to ``threshold_band`` around the current global threshold (the
  threshold's analogue of update clipping).
"""

import logging
import math
from dataclasses import dataclass

import numpy as np
from flwr.app import Array, ArrayRecord, Message, MetricRecord
from meancache.shared.threshold import check_threshold

log = logging.getLogger(__name__)

COUNT_KEY = "num-examples"


@dataclass(frozen=True)
class ReplyLimits:
    """How far one device's reply may reach (run config: max-examples, max-update-norm,
    threshold-band)."""

    max_examples: int
    max_update_norm: float
    threshold_band: float


@dataclass
class Screened:
    """The replies fit to aggregate (bounded in place), and what screening did."""

    kept: list[Message]
    rejected: dict[int, str]  # node id -> why
    clipped_updates: int
    clipped_thresholds: int


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
        check_threshold(metrics.get("threshold"))
    except ValueError as exc:
        return str(exc)
    arrays = message.content.array_records.get("arrays")
    if arrays is None or set(arrays) != set(global_arrays):
        return "its weights are not the global model's (other names)"
    for name, array in arrays.items():
        if tuple(array.shape) != tuple(global_arrays[name].shape):
            return f"its weights are not the global model's ({name} has another shape)"
        if not np.isfinite(array.numpy()).all():
            return f"its weights hold non-finite values ({name})"
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


def screen(replies: list[Message], global_arrays: ArrayRecord, threshold: float,
           limits: ReplyLimits) -> Screened:
    """Drop the unfit replies and bound the rest (their content is changed in place)."""
    kept: list[Message] = []
    rejected: dict[int, str] = {}
    for message in replies:
        if message.has_error():
            continue
        reason = reject_reason(message, global_arrays)
        if reason is None:
            kept.append(message)
        else:
            rejected[message.metadata.src_node_id] = reason
            log.warning("rejected the reply of node %d: %s", message.metadata.src_node_id,
                        reason)
    counts = [float(_metrics(m)[COUNT_KEY]) for m in kept]
    positive = [c for c in counts if c > 0]
    cap = float(limits.max_examples)
    if positive:
        cap = min(cap, float(np.median(positive)))
    clipped_updates = clipped_thresholds = 0
    for message, count in zip(kept, counts, strict=True):
        metrics = _metrics(message)
        metrics[COUNT_KEY] = int(min(count, cap))
        low, high = threshold - limits.threshold_band, threshold + limits.threshold_band
        reported = float(metrics["threshold"])
        if not low <= reported <= high:
            metrics["threshold"] = min(max(reported, low), high)
            clipped_thresholds += 1
        bounded = clip_update(message.content["arrays"], global_arrays,
                              limits.max_update_norm)
        if bounded is not None:
            message.content["arrays"] = bounded
            clipped_updates += 1
    return Screened(kept, rejected, clipped_updates, clipped_thresholds)
