"""The evidence round: after the last training round, the final global model M goes to
the devices once more in a Flower query message that trains nothing. Each device scores
its labels with M's judges (client.fl.local_round.evidence: M's verifier, the cosine in
M's encoder space) without keeping M, and replies with the sums a training reply carries
(shared.fl.bound_evidence), screened and capped alike (fl_server.screening); M's record
is then signed again with the pools naming M's judges.

Why: each training round's devices score with the model they were sent, so the pool a
round publishes beside M holds the judges of the model before M, which a device running
M never applies (docs/cache.md). Run config ``evidence-round`` (default 1) turns it off.

It runs under SecAgg+ too (fl_server.secure_rounds), outside the secure sum: SecAgg+
masks only the weights, and a reply here holds no weights, only the per-device label sums
(per judge-score bin) that every secure round's FitRes already sends in the clear, scored
by M's judges instead of the sent model's. Its cost there is a plain round's: M once more
to every device, one exchange, two sets of sums back (no key exchange, no masking).
"""

import logging
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid
from meancache.fl_server.round_model import RoundModels
from meancache.fl_server.screening import ReplyLimits, screen_evidence
from meancache.fl_server.secure_rounds import message_bytes
from meancache.shared.fl.bound_evidence import (
    ROUND_COSINE_JUDGE,
    ROUND_JUDGE,
    BoundEvidence,
    round_pool,
)
from meancache.shared.fl.checkpoint import (
    GlobalModel,
    latest_checkpoint,
    load_checkpoint,
    save_checkpoint,
)
from meancache.shared.fl.signing import server_key, sign

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvidenceRound:
    """What the devices' replies pooled (each replacing the round's pool where it holds
    labels) and what the round cost."""

    bound: BoundEvidence
    cosine_bound: BoundEvidence
    replies: int
    rejected: int
    seconds: float
    bytes_sent: int  # the messages to the devices (M's weights, each)
    bytes_received: int  # their replies

    def metrics(self) -> dict[str, float]:
        return {"evidence_round_replies": self.replies,
                "evidence_round_rejected": self.rejected,
                "evidence_round_seconds": self.seconds,
                "evidence_round_bytes_sent": self.bytes_sent,
                "evidence_round_bytes_received": self.bytes_received,
                "evidence_round_bound_labels": self.bound.labels,
                "evidence_round_cosine_bound_labels": self.cosine_bound.labels}


def gather(grid: Grid, arrays: ArrayRecord, threshold: float, judges: tuple[str, str],
           published: tuple[BoundEvidence, BoundEvidence], limits: ReplyLimits,
           timeout: float) -> EvidenceRound:
    """Send ``arrays`` (M) with the names of its ``judges`` (the verifier's, the
    cosine's) to every connected device and pool the screened replies over the
    ``published`` pools."""
    started = time.time()
    config = ConfigRecord({"threshold": threshold, ROUND_JUDGE: judges[0],
                           ROUND_COSINE_JUDGE: judges[1]})
    messages = [Message(RecordDict({"arrays": arrays, "config": config}),
                        dst_node_id=node, message_type=MessageType.QUERY)
                for node in grid.get_node_ids()]
    sent = sum(message_bytes(m) for m in messages)
    replies = list(grid.send_and_receive(messages, timeout=timeout))
    received = sum(message_bytes(r) for r in replies if r.has_content())
    screened = screen_evidence(replies, limits)
    return EvidenceRound(round_pool(published[0], screened.bound, judges[0]),
                         round_pool(published[1], screened.cosine_bound, judges[1]),
                         len(screened.kept), len(screened.rejected), time.time() - started,
                         sent, received)


def run_evidence_round(grid: Grid, checkpoint_dir: Path, models: RoundModels,
                       limits: ReplyLimits, timeout: float) -> GlobalModel | None:
    """The evidence round for the newest global model this run made (none: nothing to
    do), which is signed again with the pools it gathered; returns that record."""
    latest = latest_checkpoint(checkpoint_dir)
    if latest is None:
        return None
    meta, state = load_checkpoint(latest)
    if meta.round <= models.round_offset:  # this run made no model
        return None
    # No device ran its last round (each refused the app, or none was there): none would
    # answer the query either, and a refused app's query would only be refused again.
    if not meta.metrics.get("clients"):
        log.info("no device replied to round %d: no evidence round", meta.round)
        return None
    arrays, this_run = ArrayRecord(state), meta.round - models.round_offset
    done = gather(grid, arrays, meta.threshold,
                  (models.judge(this_run, arrays), models.cosine_judge(this_run, arrays)),
                  (BoundEvidence.from_record(meta.bound),
                   BoundEvidence.from_record(meta.cosine_bound)), limits, timeout)
    log.info("evidence round for the global model of round %d: %s", meta.round,
             done.metrics())
    return save_checkpoint(checkpoint_dir, meta.round, state, meta.threshold,
                           meta.base_model, meta.top_layers, meta.metrics | done.metrics(),
                           partial(sign, key=server_key(checkpoint_dir)),
                           meta.verifier_base, done.bound.to_record(),
                           done.cosine_bound.to_record())
