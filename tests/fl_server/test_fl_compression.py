"""Small updates (shared.fl.compression): what a device sends is bounded by the trained
layers' sizes, and the server's aggregate of decoded updates is within the quantisation
step of the float one; malformed compressed replies are refused by the screening."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message
from hypothesis import given, settings
from hypothesis import strategies as st
from meancache.client.fl.client_app import app as client_app
from meancache.fl_server.pooled_threshold import ThresholdRule
from meancache.fl_server.screening import ReplyLimits
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.fl.compression import (
    BLOCK,
    decode_update,
    encode_update,
    steps,
)
from meancache.shared.fl.evidence import Evidence
from meancache.shared.fl.weights import federated_names, federated_state
from sentence_transformers import SentenceTransformer

from tests.support.fl import (
    FEEDBACK,
    device_context,
    device_with_feedback,
    reply,
    train_message,
    wire_bound,
)


def _numpy(record: ArrayRecord) -> dict[str, np.ndarray]:
    return {name: array.numpy() for name, array in record.items()}


@pytest.mark.parametrize(("bits", "top_layers"), [(8, 1), (4, 1), (8, 0)])
def test_a_device_sends_its_update_within_the_bound_of_the_trained_layers(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch,
    bits: int, top_layers: int
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK)
    context = device_context(tmp_path, tiny_dir)
    context.run_config |= {"update-bits": bits, "top-layers": top_layers}
    sent = train_message(tiny, top_layers)
    reply = client_app(sent, context)
    assert not reply.has_error() and reply.content["metrics"]["num-examples"] > 0
    global_arrays = _numpy(sent.content["arrays"])
    sizes = {name: a.size for name, a in global_arrays.items()}
    wire = reply.content["arrays"].count_bytes()
    assert wire <= wire_bound(sizes, bits)
    float_bytes = 4 * sum(sizes.values())
    assert wire < float_bytes * (bits / 32 + 4 / BLOCK / 4) + 2 * len(sizes) * 200
    decoded = decode_update(_numpy(reply.content["arrays"]), global_arrays)
    assert set(decoded) == set(federated_names(tiny, top_layers))
    assert any(not np.array_equal(decoded[n], global_arrays[n]) for n in decoded)  # trained


@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([8, 4]), st.integers(1, 5),
       st.integers(1, 300))
def test_decoded_values_and_their_mean_are_within_half_a_step(
    seed: int, bits: int, devices: int, size: int
) -> None:
    print(f"seed {seed}, {bits} bits, {devices} devices, {size} values")
    rng = np.random.default_rng(seed)
    sent = {"w": rng.normal(size=(size,)).astype(np.float32),
            "m": rng.normal(size=(3, size)).astype(np.float32)}
    ulp = {n: np.spacing(np.abs(v).astype(np.float32) + 1) for n, v in sent.items()}
    floats, decoded, halfsteps = [], [], []
    for _ in range(devices):
        scale = 10.0 ** rng.uniform(-6, 0)
        trained = {n: (v + rng.normal(scale=scale, size=v.shape)).astype(np.float32)
                   for n, v in sent.items()}
        encoded = encode_update(trained, sent, bits)
        floats.append(trained)
        decoded.append(decode_update(encoded, sent))
        halfsteps.append({n: steps(encoded, n, v.size).reshape(v.shape) / 2
                          for n, v in sent.items()})
    for name in sent:
        for f, d, h in zip(floats, decoded, halfsteps, strict=True):
            assert (np.abs(d[name].astype(np.float64) - f[name]) <= h[name] + 2 * ulp[name]).all()
        mean_f = np.mean([f[name].astype(np.float64) for f in floats], axis=0)
        mean_d = np.mean([d[name].astype(np.float64) for d in decoded], axis=0)
        bound = np.mean([h[name] for h in halfsteps], axis=0) + 2 * ulp[name]
        assert (np.abs(mean_d - mean_f) <= bound).all()


def _reply(node: int, arrays: ArrayRecord, examples: int) -> Message:
    return reply(node, Evidence.empty().to_metrics(), examples, arrays)


def _strategy(global_arrays: ArrayRecord) -> ThresholdFedAvg:
    return ThresholdFedAvg(0.8, global_arrays, ReplyLimits(10**6, 1e6),
                           ThresholdRule(500, 50, 0.05), min_train_nodes=1,
                           min_available_nodes=1)


def test_the_servers_aggregate_of_compressed_replies_is_within_the_step_of_the_float_one(
    tiny: SentenceTransformer
) -> None:
    seed = random.randrange(2**32)
    print(f"seed {seed}")
    rng = np.random.default_rng(seed)
    state = federated_state(tiny, federated_names(tiny, 1))
    sent = {name: value.numpy() for name, value in state.items()}
    counts = [30, 10, 30]  # none above the median: screening leaves them as they are
    trained = [{n: (v + rng.normal(scale=1e-3, size=v.shape)).astype(np.float32)
                for n, v in sent.items()} for _ in counts]
    results = {}
    for bits in (0, 8, 4):
        strategy = _strategy(ArrayRecord(state))
        replies = []
        for node, (t, count) in enumerate(zip(trained, counts, strict=True), start=1):
            body = t if bits == 0 else encode_update(t, sent, bits)
            arrays = ArrayRecord({n: Array(v) for n, v in body.items()})
            replies.append(_reply(node, arrays, count))
        arrays, _ = strategy.aggregate_train(1, replies)
        assert arrays is not None and not strategy.screened[1].rejected
        results[bits] = (_numpy(arrays), sum(strategy.bytes_received[1].values()))
    weights = np.array(counts) / sum(counts)
    for bits in (8, 4):
        # Each value's error is within half its block's step, whose largest is
        # max|update| / qmax of the device's block: the weighted mean of those bounds it.
        qmax = 2 ** (bits - 1) - 1
        for name, value in results[0][0].items():
            halfsteps = [steps(encode_update(t, sent, bits), name, value.size)
                         .reshape(value.shape) / 2 for t in trained]
            bound = sum(w * h for w, h in zip(weights, halfsteps, strict=True))
            ulp = np.spacing(np.abs(value) + 1)
            assert (np.abs(results[bits][0][name].astype(np.float64) - value)
                    <= bound + 4 * ulp).all(), name
            assert (bound <= np.max([np.abs(t[name] - sent[name]).max() for t in trained])
                    / qmax / 2 + 1e-12).all()
        sizes = {name: value.size for name, value in sent.items()}
        assert results[bits][1] <= len(counts) * wire_bound(sizes, bits) < results[0][1]


@pytest.mark.parametrize(("break_it", "reason"), [
    (lambda a: a.pop(next(iter(a))), "not of the global model's tensors"),
    (lambda a: a.update({k: -v for k, v in a.items() if k.endswith(":scale")}),
     "negative scales"),
    (lambda a: a.update({k: v * np.float32("nan") for k, v in a.items()
                         if k.endswith(":scale")}), "non-finite"),
    (lambda a: a.update({k: v[:-1] for k, v in a.items() if k.endswith(":scale")}),
     "malformed scales"),
    (lambda a: a.update({k: v.astype(np.int16) for k, v in a.items() if k.endswith(":q")}),
     "malformed values"),
])
def test_a_malformed_compressed_reply_is_rejected_naming_why(
    tiny: SentenceTransformer, break_it: object, reason: str
) -> None:
    state = federated_state(tiny, federated_names(tiny, 1))
    sent = {name: value.numpy() for name, value in state.items()}
    trained = {n: v + np.float32(1e-3) for n, v in sent.items()}
    good = encode_update(trained, sent, 8)
    bad = encode_update(trained, sent, 8)
    break_it(bad)  # type: ignore[operator]
    strategy = _strategy(ArrayRecord(state))
    replies = [_reply(1, ArrayRecord({n: Array(v) for n, v in good.items()}), 10),
               _reply(2, ArrayRecord({n: Array(v) for n, v in bad.items()}), 10)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None  # the good reply alone
    rejected = strategy.screened[1].rejected
    assert set(rejected) == {2} and reason in rejected[2]
    for name, value in _numpy(arrays).items():
        assert np.allclose(value, trained[name], atol=float(np.abs(trained[name] - sent[name])
                                                             .max()) / 127)
    assert all(isinstance(v, torch.Tensor) for v in arrays.to_torch_state_dict().values())
