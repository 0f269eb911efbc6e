"""The Flower ClientApp: its mods (what may leave the device, clipping, the quantised
update, SecAgg+) around the handlers of a device's part of a round (client.fl.local_round).

Flower starts a process for each message, and a SecAgg+ round sends four, of which one
trains: the handlers import local_round (torch, the encoder) only when a message asks for
training or evaluation, so that the protocol's other stages start in about a second.

Settings: shared.fl.client_config.ClientConfig. Node config: data-dir (the user's meancache
data dir) on a real device; partition-id and num-partitions in simulation.
"""

import logging
from typing import Any

from flwr.app import Array, ArrayRecord, Context, Message
from flwr.clientapp import ClientApp
from flwr.clientapp.mod import fixedclipping_mod
from meancache.client.fl.secure import RECORDS, is_secure, secure_mod
from meancache.shared.fl.bound_evidence import COSINE_KEYS
from meancache.shared.fl.bound_evidence import KEYS as BOUND_KEYS
from meancache.shared.fl.client_config import ClientConfig
from meancache.shared.fl.compression import encode_update
from meancache.shared.fl.evidence import KEYS as EVIDENCE_KEYS
from meancache.shared.fl.secure import SECURE

log = logging.getLogger(__name__)

# What a reply may contain: anything else is refused before it leaves the device.
ALLOWED_METRICS = frozenset({"num-examples", "train-loss", "verifier-train-loss", "skipped",
                             "precision", "recall", "f1", "f05", *EVIDENCE_KEYS,
                             *BOUND_KEYS, *COSINE_KEYS})


def wire_audit_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """Refuse to send anything but weights and the allowed metrics (no text, no config;
    in a SecAgg+ round, also the protocol's own record and the FitRes's status and
    metrics, client.fl.secure)."""
    reply = call_next(msg, context)
    if reply.has_error():
        return reply
    content = reply.content
    secure = is_secure(content)
    records = [*content.metric_records.values(),
               *(content.config_records[n] for n in ("fitres.metrics",)
                 if secure and n in content.config_records)]
    extra = (set(content.config_records) - (RECORDS if secure else set())) or {
        key for record in records for key in record
        if key not in ALLOWED_METRICS | ({"num_examples"} if secure else set())}
    if extra:
        log.error("refused to send %s to the server", sorted(extra))
        raise PermissionError(f"reply holds fields that may not leave the device: {extra}")
    return reply


def clip_when_asked_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """Flower's fixed clipping, when the server runs central DP (it sends clipping_norm)."""
    config = next(iter(msg.content.config_records.values()), {})
    if "clipping_norm" in config:
        return fixedclipping_mod(msg, context, call_next)
    return call_next(msg, context)


def compress_update_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """Send the update quantised (run config update-bits), each matrix's as rank-r factors
    (update-rank; shared.fl.compression), instead of the float32 weights: outside the
    clipping mod, so what is encoded is clipped. Not in a SecAgg+ round, which masks full
    weights."""
    reply = call_next(msg, context)
    config = ClientConfig.from_run_config(context.run_config)
    bits = config.update_bits
    if bits == 0 or reply.has_error() or SECURE in msg.content["config"]:
        return reply
    sent = {name: array.numpy() for name, array in msg.content["arrays"].items()}
    trained = {name: array.numpy() for name, array in reply.content["arrays"].items()}
    reply.content["arrays"] = ArrayRecord(
        {name: Array(value) for name, value in encode_update(
            trained, sent, bits, config.update_rank).items()})
    return reply


app = ClientApp(mods=[wire_audit_mod])


@app.train(mods=[secure_mod, compress_update_mod, clip_when_asked_mod])
def train(msg: Message, context: Context) -> Message:
    from meancache.client.fl import local_round

    return local_round.train(msg, context)


@app.query()
def evidence(msg: Message, context: Context) -> Message:
    """The evidence round after the last (fl_server.evidence_round)."""
    from meancache.client.fl import local_round

    return local_round.evidence(msg, context)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    from meancache.client.fl import local_round

    return local_round.evaluate(msg, context)
