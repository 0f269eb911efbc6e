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
(shared.fl.secure.sketch_entries), and what the device trained but did not send is kept
for its next round (error feedback, ``_sketched``).
"""

import math
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.client.mod import secaggplus_mod
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters, parameters_to_ndarrays
from flwr.common.secure_aggregation.secaggplus_constants import RECORD_KEY_CONFIGS
from flwr.compat.common import recorddict_compat as compat
from meancache.shared.fl.secure import NAMES, SKETCH_SEED, SKETCH_SHARE, sketch_entries, to_scalars

MAX_EXAMPLES = "max-examples"  # fit-config key: the server's cap on a device's weight
CLIPPING_NORM = "clipping_norm"  # fit-config key: the norm a device clips its update to
RESIDUAL = "secure-residual"  # context.state: what this device trained and has not sent
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
    start = parameters_to_ndarrays(fitins.parameters)
    if len(names) != len(start):
        raise ValueError(f"the round names {len(names)} tensors for {len(start)} weights")
    legacy = msg.content
    msg.content = RecordDict({
        "arrays": ArrayRecord({n: Array(w) for n, w in zip(names, start, strict=True)}),
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
    trained = [arrays[n].numpy() for n in names]
    if share < 1:
        sent = _sketched(names, start, trained, share, seed, context.state,
                         float(config.get(CLIPPING_NORM, 0.0)))
    else:
        sent = trained
        context.state.array_records.pop(RESIDUAL, None)
    fitres = FitRes(Status(Code.OK, ""), ndarrays_to_parameters(sent), count,
                    to_scalars(metrics))
    return Message(compat.fitres_to_recorddict(fitres, keep_input=True), reply_to=msg)


def _sketched(names: list[str], start: list[np.ndarray], trained: list[np.ndarray],
              share: float, seed: int, state: RecordDict, clip: float) -> list[np.ndarray]:
    """The weights a device puts into the masked sum under an upload cap: each tensor's
    update, plus what this device trained in earlier rounds and did not send (error
    feedback, as for sparsified SGD: Stich, Cordonnier and Jaggi, NeurIPS 2018), taken at
    the round's shared entries (small tensors whole), clipped as a whole to ``clip``
    (a device's part of the sum stays bounded, under DP too), and added to the weights it
    was sent. What was not sent, or clipping held back, is kept in ``state`` for the next
    round this device takes part in."""
    kept = state.array_records.get(RESIDUAL)
    residual = {n: kept[n].numpy() for n in kept} if kept is not None else {}
    updates, picks = [], []
    for name, before, after in zip(names, start, trained, strict=True):
        update = (after.astype(np.float64) - before).ravel()
        carried = residual.get(name)
        if carried is not None and carried.shape == update.shape:
            update += carried
        updates.append(update)
        picks.append(sketch_entries(update.size, share, seed, name))
    parts = [u if e is None else u[e] for u, e in zip(updates, picks, strict=True)]
    norm = math.sqrt(sum(float(np.dot(p, p)) for p in parts))
    scale = min(1.0, clip / norm) if clip > 0 and norm > 0 else 1.0
    sent, left = [], {}
    for name, before, update, entries, part in zip(names, start, updates, picks, parts,
                                                   strict=True):
        flat = before.ravel().astype(np.float64)
        rest = update.copy()
        if entries is None:
            sent.append((flat + scale * part).reshape(before.shape).astype(before.dtype))
            rest -= scale * part
        else:
            sent.append((flat[entries] + scale * part).astype(before.dtype))
            rest[entries] -= scale * part
        left[name] = Array(rest.astype(np.float32))
    state.array_records[RESIDUAL] = ArrayRecord(left)
    return sent
