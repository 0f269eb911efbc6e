"""A device's side of a SecAgg+ round (fl_server.secure_rounds): Flower's
``secaggplus_mod`` runs the protocol (keys, shares, the masked weights, unmasking) and,
when it needs this device's weights, the legacy fit message is turned into the Message-API
one the ClientApp trains on, and its reply back into a legacy FitRes.

On the way out the example count is clamped to the ``max-examples`` the server sent: the
server cannot clamp what it cannot see (under central DP it sends 1: every device counts
once). The update's norm is clipped by the ClientApp's clipping mod (the server sends
``clipping_norm``, the DP clipping norm under DP), before the weights are masked; they
are not quantised (SecAgg+ masks full weights). Where the server's upload cap asks for it
(``sketch-share`` under 1), only the round's shared entries of each large tensor go
(shared.fl.secure.sketch_entries).
"""

from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from meancache.shared.fl.secure import NAMES, SKETCH_SEED, SKETCH_SHARE, sketch_entries, to_scalars

MAX_EXAMPLES = "max-examples"  # fit-config key: the server's cap on a device's weight
# The records a SecAgg+ reply holds: the protocol's own, the FitRes's metrics and status.
RECORDS = frozenset({RECORD_KEY_CONFIGS, "fitres.metrics", "fitres.status"})


def is_secure(content: RecordDict) -> bool:
    return RECORD_KEY_CONFIGS in content.config_records


def secure_mod(msg: Message, context: Context, call_next: Any) -> Message:
    """SecAgg+ rounds through Flower's mod; any other message passes unchanged."""
    if not is_secure(msg.content):
        return call_next(msg, context)
    return secaggplus_mod(msg, context, lambda m, c: _train_legacy(m, c, call_next))


def _train_legacy(msg: Message, context: Context, call_next: Any) -> Message:
    fitins = compat.recorddict_to_fitins(msg.content, keep_input=True)
    config = dict(fitins.config)
    names = str(config.pop(NAMES)).split("\n")
    cap = int(config.pop(MAX_EXAMPLES))
    share, seed = float(config.pop(SKETCH_SHARE)), int(config.pop(SKETCH_SEED))
    if not 0 < share <= 1:  # the server's word, checked like any other
        raise ValueError(f"the round asks for a share of {share!r} of the weights")
    weights = parameters_to_ndarrays(fitins.parameters)
    if len(names) != len(weights):
        raise ValueError(f"the round names {len(names)} tensors for {len(weights)} weights")
    legacy = msg.content
    msg.content = RecordDict({
        "arrays": ArrayRecord({n: Array(w) for n, w in zip(names, weights, strict=True)}),
        "config": ConfigRecord(config)})
    try:
        reply = call_next(msg, context)
    finally:
        msg.content = legacy
    if reply.has_error():
        return reply
    arrays, metrics = reply.content["arrays"], dict(reply.content["metrics"])
    count = min(int(metrics["num-examples"]), cap)
    metrics["num-examples"] = count
    sent = []
    for name in names:
        weights = arrays[name].numpy()
        entries = sketch_entries(weights.size, share, seed, name)
        sent.append(weights if entries is None else weights.ravel()[entries])
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(sent), count,
                    to_scalars(metrics))
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)
