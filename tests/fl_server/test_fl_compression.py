"""Small updates (shared.fl.compression): what a device sends is bounded by the trained
layers' sizes, and the server's aggregate of decoded updates is within the quantisation
step of the float one; a low-rank update decodes to the rank-r approximation within the
bound its factors' steps give; malformed compressed replies are refused by the
screening; the defaults fit the 5 MB budget with MPNet and the verifier."""

import random
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, Message
from hypothesis import given, settings
from hypothesis import strategies as st
from meancache.client.fl.client_app import app as client_app
from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.pooled_threshold import ThresholdRule
from meancache.fl_server.screening import ReplyLimits
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.fl.compression import (
    BLOCK,
    compressed_bytes,
    decode_update,
    encode_update,
    factors,
    steps,
)
from meancache.shared.fl.evidence import Evidence
from meancache.shared.fl.weights import (
    VERIFIER,
    federated_names,
    federated_state,
    verifier_names,
)
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


@pytest.mark.parametrize(("bits", "top_layers", "rank"),
                         [(8, 1, 0), (4, 1, 0), (8, 0, 0), (4, 1, 4), (8, 0, 2)])
def test_a_device_sends_its_update_within_the_bound_of_the_trained_layers(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch,
    bits: int, top_layers: int, rank: int
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK)
    context = device_context(tmp_path, tiny_dir)
    context.run_config |= {"update-bits": bits, "top-layers": top_layers, "update-rank": rank}
    sent = train_message(tiny, top_layers)
    reply = client_app(sent, context)
    assert not reply.has_error() and reply.content["metrics"]["num-examples"] > 0
    global_arrays = _numpy(sent.content["arrays"])
    shapes = {name: a.shape for name, a in global_arrays.items()}
    wire = reply.content["arrays"].count_bytes()
    assert wire <= wire_bound(shapes, bits, rank)
    float_bytes = 4 * sum(a.size for a in global_arrays.values())
    assert wire < float_bytes * (bits / 32 + 4 / BLOCK / 4) + 2 * len(shapes) * 200
    payload = sum(a.nbytes for a in _numpy(reply.content["arrays"]).values())
    assert payload == compressed_bytes(shapes, bits, rank)
    if rank:  # the tiny model's matrices travel as factors: fewer values than it has
        assert any(name.endswith(":u:q") for name in reply.content["arrays"])
        assert compressed_bytes(shapes, bits, rank) < compressed_bytes(shapes, bits, 0)
    decoded = decode_update(_numpy(reply.content["arrays"]), global_arrays, rank)
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
        shapes = {name: value.shape for name, value in sent.items()}
        assert results[bits][1] <= len(counts) * wire_bound(shapes, bits) < results[0][1]


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


# low-rank updates --------------------------------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(st.integers(0, 2**32 - 1), st.sampled_from([8, 4]), st.integers(2, 150),
       st.integers(2, 150), st.integers(1, 12), st.booleans())
def test_a_low_rank_update_decodes_to_its_rank_r_approximation_within_the_factors_steps(
    seed: int, bits: int, rows: int, cols: int, rank: int, exact: bool
) -> None:
    """The decoded update is the update's best rank-r approximation (its truncated SVD,
    the update itself when its rank is r), within what quantising the factors can move a
    product: with u = u' - e_u, |e_u| <= h_u (half steps) and likewise for v,
    |u'.T v' - u.T v| <= h_u.T |v'| + |u'|.T h_v + h_u.T h_v."""
    rank = min(rank, rows * cols // (rows + cols + 1))
    if rank < 1:
        rank = 1
        rows, cols = max(rows, 4), max(cols, 4)
    print(f"seed {seed}, {bits} bits, {rows} x {cols}, rank {rank}, exact {exact}")
    rng = np.random.default_rng(seed)
    sent = {"m": rng.normal(size=(rows, cols)).astype(np.float32)}
    scale = 10.0 ** rng.uniform(-5, -1)
    if exact:  # an update of rank r, as fine-tuning's often nearly are
        update = rng.normal(scale=scale, size=(rows, rank)) @ rng.normal(size=(rank, cols))
    else:
        update = rng.normal(scale=scale, size=(rows, cols))
    trained = {"m": (sent["m"] + update).astype(np.float32)}
    update = trained["m"].astype(np.float64) - sent["m"]  # what the device can see
    left, singular, right = np.linalg.svd(update, full_matrices=False)
    best = (left[:, :rank] * singular[:rank]) @ right[:rank]
    encoded = encode_update(trained, sent, bits, rank)
    assert set(encoded) == {"m:u:q", "m:u:scale", "m:v:q", "m:v:scale"}
    decoded = decode_update(encoded, sent, rank)["m"].astype(np.float64) - sent["m"]
    u, v = factors(encoded, "m", (rows, cols), rank)
    h_u, h_v = steps(encoded, "m:u", rows) / 2, steps(encoded, "m:v", cols) / 2
    bound = h_u.T @ np.abs(v) + np.abs(u).T @ h_v + h_u.T @ h_v
    # float32 rounding of global + update, and the SVD's own rounding
    slack = 2 * np.spacing(np.abs(trained["m"]) + 1) + 1e-9 * singular[0]
    assert (np.abs(decoded - best) <= bound + slack).all()


def _tiny_update(tiny: SentenceTransformer) -> tuple[dict[str, torch.Tensor], dict[str, np.ndarray],
                                                     dict[str, np.ndarray]]:
    state = federated_state(tiny, federated_names(tiny, 1))
    sent = {name: value.numpy() for name, value in state.items()}
    rng = np.random.default_rng(random.randrange(2**32))
    trained = {n: (v + rng.normal(scale=1e-3, size=v.shape)).astype(np.float32)
               for n, v in sent.items()}
    return state, sent, trained


def _first_matrix(arrays: dict[str, np.ndarray]) -> str:
    return next(name for name in arrays if name.endswith(":u:q"))[:-len(":u:q")]


def _cut_a_column(arrays: dict[str, np.ndarray]) -> None:
    name = _first_matrix(arrays)
    arrays[name + ":u:q"] = arrays[name + ":u:q"][:, :-1]


def _drop_a_component(arrays: dict[str, np.ndarray]) -> None:
    name = _first_matrix(arrays)
    for part in (":v:q", ":v:scale"):
        arrays[name + part] = arrays[name + part][:-1]


def _flatten(arrays: dict[str, np.ndarray]) -> None:
    name = _first_matrix(arrays)
    for part in (":u:q", ":u:scale"):
        arrays[name + part] = arrays[name + part].ravel()


def _nan_scale(arrays: dict[str, np.ndarray]) -> None:
    arrays[_first_matrix(arrays) + ":v:scale"][0, 0] = np.nan


@pytest.mark.parametrize(("rank", "cap", "break_it", "reason"), [
    (6, 4, None, "has rank 6, not between 1 and the run's update-rank 4"),
    (4, 0, None, "not of the global model's tensors"),  # factors where none are decoded
    (4, 4, _cut_a_column, "malformed values"),
    (4, 4, _drop_a_component, "malformed scales"),
    (4, 4, _flatten, "has rank 0"),
    (4, 4, _nan_scale, "non-finite or negative scales"),
])
def test_a_low_rank_reply_over_the_rank_or_misshapen_is_rejected_naming_why(
    tiny: SentenceTransformer, rank: int, cap: int, break_it: object, reason: str
) -> None:
    state, sent, trained = _tiny_update(tiny)
    good = encode_update(trained, sent, 4, cap) if cap else encode_update(trained, sent, 4)
    bad = encode_update(trained, sent, 4, rank)
    if break_it is not None:
        break_it(bad)  # type: ignore[operator]
    strategy = ThresholdFedAvg(0.8, ArrayRecord(state), ReplyLimits(10**6, 1e6, cap),
                               ThresholdRule(500, 50, 0.05), min_train_nodes=1,
                               min_available_nodes=1)
    replies = [_reply(1, ArrayRecord({n: Array(v) for n, v in good.items()}), 10),
               _reply(2, ArrayRecord({n: Array(v) for n, v in bad.items()}), 10)]
    arrays, _ = strategy.aggregate_train(1, replies)
    assert arrays is not None  # the good reply alone
    rejected = strategy.screened[1].rejected
    assert set(rejected) == {2} and reason in rejected[2], rejected
    expected = decode_update(good, sent, cap)
    for name, value in _numpy(arrays).items():
        assert np.allclose(value, expected[name], rtol=1e-6, atol=1e-7), name


def _shapes(model: torch.nn.Module, names: list[str], prefix: str = ""
            ) -> dict[str, tuple[int, ...]]:
    params = dict(model.named_parameters())
    return {prefix + name: tuple(params[name].shape) for name in names}


def test_the_default_update_of_mpnet_and_the_verifier_fits_the_5_mb_budget() -> None:
    """The app's defaults (update-bits, update-rank, top-layers, verifier-top-layers) with
    MPNet-base's shapes and the verifier's (MiniLM-L6 cross-encoder): the bytes the
    server counts (values, scales, each array's npy header and name; the tiny test above
    holds the count to the real record's) stay within 5 MB, which every value at the same
    bits does not."""
    from meancache.shared.encoder import packaged_minilm_dir
    from meancache.shared.verifier.model import CrossEncoder
    from transformers import AutoConfig, BertModel, MPNetConfig, MPNetModel

    config = default_run_config()
    with torch.device("meta"):  # shapes only: no weights are made
        encoder = torch.nn.Sequential()
        encoder.add_module("auto_model", MPNetModel(MPNetConfig()))  # MPNet-base's shapes
        encoder = torch.nn.Sequential(encoder)  # named as in a SentenceTransformer
        minilm = AutoConfig.from_pretrained(str(packaged_minilm_dir()), local_files_only=True)
        verifier = CrossEncoder(BertModel(minilm, add_pooling_layer=False))
    shapes = _shapes(encoder, federated_names(encoder, int(config["top-layers"])))  # type: ignore[arg-type]
    assert len(shapes) >= 2 * 16  # two layers' tensors
    shapes |= _shapes(verifier, verifier_names(verifier, int(config["verifier-top-layers"])),
                      VERIFIER)
    bits, rank = int(config["update-bits"]), int(config["update-rank"])
    assert wire_bound(shapes, bits, rank) <= 5 * 10**6 < wire_bound(shapes, bits, 0)
