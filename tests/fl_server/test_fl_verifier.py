"""The learned verifier in federated learning: its float base decoded from the int8 file,
a device's round (trained top layer and head sent as an 8-bit update, the global one
exported back to int8 and used), and `fl sync` installing a signed global verifier and
refusing an altered one. Tiny random-init models; the simulation with the verifier is
in test_fl.py."""

import json
import shutil
from functools import partial
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from meancache.client.cache.entry import Entry
from meancache.client.cache.store import EntryStore
from meancache.client.config import load_settings
from meancache.client.fl.client_app import app as client_app
from meancache.client.fl.device import DeviceState
from meancache.client.fl.local_round import for_encoder
from meancache.client.fl.sync import sync_global_model
from meancache.client.fl.train import pair_similarities
from meancache.client.learning.bound import Label
from meancache.client.learning.state import Learned
from meancache.client.verifier import load_device_verifier
from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.model_endpoint import create_model_app
from meancache.fl_server.round_model import RoundModels
from meancache.shared.encoder import Encoder
from meancache.shared.errors import CheckpointError, RunConfigError, VerifierError
from meancache.shared.fl.bound_evidence import (
    BINS,
    COSINE_KEYS,
    ROUND_COSINE_JUDGE,
    ROUND_JUDGE,
    BoundEvidence,
    cosine_judge,
)
from meancache.shared.fl.bound_evidence import KEYS as BOUND_KEYS
from meancache.shared.fl.checkpoint import (
    DESCRIPTION_KEY,
    META,
    VERIFIER,
    latest_checkpoint,
    read_meta,
    save_checkpoint,
)
from meancache.shared.fl.run_config import ModelConfig
from meancache.shared.fl.signing import PUBLIC_KEY, server_key, sign
from meancache.shared.fl.weights import (
    federated_names,
    federated_state,
    load_federated_state,
    split_verifier,
    verifier_names,
    verifier_subset,
    with_verifier,
)
from meancache.shared.pairs import Pair
from meancache.shared.query import normalise_query
from meancache.shared.verifier.dequantise import float_verifier
from meancache.shared.verifier.federated import base_tensors, pair_probabilities
from meancache.shared.verifier.model import export_onnx, quantize_int8
from meancache.shared.verifier.runtime import MODEL_FILE, LearnedVerifier, read_card
from onnx import numpy_helper
from sentence_transformers import SentenceTransformer

from tests.support.fl import (
    FEEDBACK,
    ROUND_KEY,
    device_context,
    device_with_feedback,
    impostor_endpoint,
    message,
    round_message,
    trust_round_key,
    weights_sent,
)
from tests.support.servers import serving

PAIRS = [("how do I cook rice", "what is the best way to cook rice"),
         ("what is the capital of France", "what is the currency of France")]


def _initialisers(path: Path) -> dict[str, np.ndarray]:
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(str(path)).graph.initializer}


def test_the_float_base_is_exactly_the_int8_verifiers_weights(
    tiny_verifier: Path, tmp_path: Path
) -> None:
    """Quantised again as the shipped file was made, the decoded float model gives back
    every int8 tensor bit for bit: it holds those weights and nothing else."""
    model = float_verifier(tiny_verifier)
    export_onnx(model, tmp_path / "float.onnx")
    quantize_int8(tmp_path / "float.onnx", tmp_path / "again.onnx")
    original, again = _initialisers(tiny_verifier / MODEL_FILE), _initialisers(
        tmp_path / "again.onnx")
    assert set(original) == set(again)
    for name, value in original.items():
        assert value.dtype == again[name].dtype and np.array_equal(value, again[name]), name
    altered = altered_copy(tiny_verifier, tmp_path)
    with pytest.raises(VerifierError, match="not the one its card names"):
        float_verifier(altered)


def altered_copy(verifier_dir: Path, tmp_path: Path) -> Path:
    """A copy of the verifier whose model file has one bit flipped (its card unchanged)."""
    altered = tmp_path / "altered"
    shutil.copytree(verifier_dir, altered)
    data = bytearray((altered / MODEL_FILE).read_bytes())
    data[-100] ^= 1
    (altered / MODEL_FILE).write_bytes(bytes(data))
    return altered


@pytest.mark.parametrize("top_layers", [0, 1])
def test_the_servers_verifier_tensors_are_the_float_bases_without_building_it(
        tiny_verifier: Path, tmp_path: Path, top_layers: int) -> None:
    """The ServerApp starts from the int8 file's decoded tensors (base_tensors), never
    building the network: the same names and values a device's float base sends, and a
    replaced file is refused there too."""
    model = float_verifier(tiny_verifier)
    read = base_tensors(tiny_verifier)
    names = verifier_names(model, top_layers)
    assert sorted(verifier_subset(read, top_layers)) == sorted(names)
    for name, value in federated_state(model, names).items():
        assert read[name].dtype == value.dtype and torch.equal(read[name], value), name
    altered = altered_copy(tiny_verifier, tmp_path)
    with pytest.raises(VerifierError, match="not the one its card names"):
        base_tensors(altered)


def _global(tiny: SentenceTransformer, verifier_dir: Path, nudge: float = 0.0
            ) -> dict[str, torch.Tensor]:
    """What the server sends: the encoder's top layer and the verifier's top layer and
    head (``nudge`` added to the verifier's, as rounds of training would)."""
    verifier = float_verifier(verifier_dir)
    judged = federated_state(verifier, verifier_names(verifier, 1))  # type: ignore[arg-type]
    return with_verifier(federated_state(tiny, federated_names(tiny, 1)),
                         {k: v + nudge for k, v in judged.items()})


def test_a_device_trains_the_verifier_and_runs_the_global_one_as_int8(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, tiny_verifier: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK)
    # What the cache learned from the upstream's answers: a question confirmed to share an
    # entry's answer (a label that is right, and its alias) is a positive pair for the
    # verifier, a candidate whose answer was not the upstream's a negative one; a user's
    # "wrong answer" is among the feedback pairs already.
    store = EntryStore(tmp_path / "cache")
    entry = Entry("how do I boil an egg", "ten minutes", np.zeros(4, np.float32), "v")
    store.put(entry)
    learned = Learned(store, 0.02)
    learned.learn(Label(0.9, False, 1.0, entry.id), "How do you boil eggs?")
    learned.learn(Label(0.7, True, 1.0, entry.id), "How do I boil an egg in a microwave?")
    learned.learn(Label(0.6, True, 1.0, entry.id, "user", "how long to boil an egg"))
    store.close()
    assert set(DeviceState(tmp_path).learned_pairs()) == {
        Pair("how do you boil eggs", "how do I boil an egg", 1),
        Pair("how do i boil an egg in a microwave", "how do I boil an egg", 0)}
    context = device_context(tmp_path, tiny_dir, {"verifier-top-layers": 1,
                                                  "verifier-model": str(tiny_verifier)})
    trust_round_key(monkeypatch)
    base_sha = read_card(tiny_verifier).sha256
    sent = _global(tiny, tiny_verifier)
    request = round_message(ArrayRecord(sent), 0.8, 0, verifier_base=base_sha)
    reply = client_app(request, context)
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    assert reply.content["metrics"]["verifier-train-loss"] > 0
    trained = weights_sent(reply, request)  # an 8-bit update, decoded
    _, judged = split_verifier({k: torch.from_numpy(v) for k, v in trained.items()})
    assert set(judged) == set(split_verifier(sent)[1])
    assert any(not torch.allclose(judged[k], split_verifier(sent)[1][k]) for k in judged)

    # a global model without the verifier's tensors is an error, not a silent skip
    bare = message(RecordDict({"arrays": ArrayRecord(split_verifier(sent)[0]),
                               "config": ConfigRecord({"threshold": 0.8})}))
    with pytest.raises(ValueError, match="does not hold the verifier's top 1 layers"):
        client_app(bare, context)

    settings = load_settings(data_dir=tmp_path)
    assert load_device_verifier(settings) is None  # nothing global evaluated yet
    global_state = ArrayRecord(_global(tiny, tiny_verifier, nudge=0.05))
    # The round's signed description names the verifier's base: one naming another base
    # (or none), or whose verifier_base was altered after signing, is not kept.
    altered = round_message(global_state, 0.8, 2, verifier_base=base_sha, kind="evaluate")
    config = altered.content["config"]
    config[DESCRIPTION_KEY] = str(config[DESCRIPTION_KEY]).replace(base_sha, "f" * 64)
    for refused in (altered, *(round_message(global_state, 0.8, 2, verifier_base=other,
                                             kind="evaluate") for other in ("f" * 64, ""))):
        assert not client_app(refused, context).has_error()  # it still takes part
        assert latest_checkpoint(settings.global_model_dir).name == "round-0000"  # type: ignore[union-attr]
    evaluation = round_message(global_state, 0.8, 1, verifier_base=base_sha, kind="evaluate")
    assert not client_app(evaluation, context).has_error()
    kept = latest_checkpoint(settings.global_model_dir)
    assert kept is not None and kept.name == "round-0001"
    assert json.loads((kept / META).read_text())["verifier_base"] == base_sha
    device = load_device_verifier(settings)
    assert device is not None and device.threshold == read_card(tiny_verifier).threshold
    # as a judge of the error-bound labels it goes by the global model's sha256, which
    # the server names the rounds' pools by (its int8 file is this device's own make)
    assert device.card.judge == read_meta(kept).sha256 != device.card.sha256
    base = LearnedVerifier.load(tiny_verifier)
    first, second = zip(*PAIRS, strict=True)
    assert not np.allclose(device.pair_probabilities(first, second),
                           base.pair_probabilities(first, second), atol=1e-4)


def test_a_run_federating_the_verifier_alone_keeps_every_devices_vector_space(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, tiny_verifier: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """train-encoder = 0: the round carries the verifier's tensors alone, a device trains
    and sends only those, and the global model it keeps leaves its encoder the base
    model, of the base model's version (no cache re-embeds), so the cosine every round
    names (fl_server.round_model) is the one its verifier-off caches run, round after
    round: the pool of the cosine's labels applies."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    trust_round_key(monkeypatch)
    device_with_feedback(tmp_path, FEEDBACK)
    context = device_context(tmp_path, tiny_dir, {"verifier-top-layers": 1, "train-encoder": 0,
                                                  "verifier-model": str(tiny_verifier)})
    base = Encoder.load(tiny_dir, backend="torch")
    models = RoundModels(ROUND_KEY, base.base_version, 1, 0, read_card(tiny_verifier).sha256)
    sent = ArrayRecord({k: v for k, v in _global(tiny, tiny_verifier, nudge=0.05).items()
                        if k.startswith(VERIFIER)})
    request = message(RecordDict({"arrays": sent, "config": ConfigRecord({
        "threshold": 0.8, DESCRIPTION_KEY: models.describe(1, 0.8, sent),
        ROUND_COSINE_JUDGE: models.cosine_judge(1, sent)})}))
    reply = client_app(request, context)
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    assert reply.content["metrics"]["train-loss"] == 0.0  # the encoder did not train
    assert reply.content["metrics"]["verifier-train-loss"] > 0
    assert set(weights_sent(reply, request)) == set(sent)  # the verifier's tensors alone
    kept = latest_checkpoint(load_settings(data_dir=tmp_path).global_model_dir)
    assert kept is not None and kept.name == "round-0001"
    device = Encoder.load(tiny_dir, backend="torch", global_weights=kept)
    assert device.version == base.version  # the base model's space: nothing re-embeds
    assert models.cosine_judge(1, sent) == models.cosine_judge(7, sent) == cosine_judge(
        device.version) == models.cosine_judge(0, sent)
    with pytest.raises(RunConfigError, match="'train-encoder' = 0 needs"):
        ModelConfig.from_run_config({**default_run_config(), "train-encoder": 0,
                                     "verifier-top-layers": 0})


def test_the_evidence_round_scores_every_label_with_the_final_models_judges(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, tiny_verifier: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """The query message after the last round (fl_server.evidence_round): labels scored
    by older judges (another verifier, another vector space) are scored anew by the
    verifier and the encoder it carries, on (question, its entry's question), and sent
    as both judges' sums; nothing trains, nothing is kept, and the labels count as sent."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    trust_round_key(monkeypatch)
    store = EntryStore(tmp_path / "cache")
    entries = [Entry(q, "answer", np.zeros(4, np.float32), "v") for q in (
        "how do I boil an egg", "what is the capital of France", "who wrote Hamlet")]
    for entry in entries:
        store.put(entry)
    learned = Learned(store, 0.02, judge="an older verifier")
    asked = [("How do you boil eggs?", 0, False), ("Which city is France's capital?", 1, False),
             ("What is the capital of Spain?", 1, True), ("Who wrote Macbeth?", 2, True)]
    for i, (question, at, wrong) in enumerate(asked):
        learned.learn(Label(0.97, wrong, 0.5 if i % 2 else 1.0, entries[at].id), question)
    learned.judge = cosine_judge("an older space")
    learned.learn(Label(0.99, False, 1.0, entries[0].id), "how to boil an egg")
    learned.learn(Label(0.95, True, 1.0, "evicted"), "a question whose entry is gone")
    store.close()
    sent = ArrayRecord(_global(tiny, tiny_verifier, nudge=0.05))
    models = RoundModels(ROUND_KEY, "base", 1, 0, read_card(tiny_verifier).sha256)
    judges = {ROUND_JUDGE: models.judge(2, sent), ROUND_COSINE_JUDGE: models.cosine_judge(
        2, sent)}
    request = message(RecordDict({"arrays": sent, "config": ConfigRecord({
        "threshold": 0.8, DESCRIPTION_KEY: models.describe(2, 0.8, sent), **judges})}),
        kind="query")
    context = device_context(tmp_path, tiny_dir, {"verifier-top-layers": 1,
                                                  "verifier-model": str(tiny_verifier)})
    reply = client_app(request, context)
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    assert not reply.content.array_records and not reply.content.config_records
    assert set(reply.content["metrics"]) == {*BOUND_KEYS, *COSINE_KEYS}
    # M's scores of the five labels whose entry is there, as the round's judges give them
    pairs = [Pair(normalise_query(q), entries[at].query, 0) for q, at, _ in asked] + [
        Pair("how to boil an egg", entries[0].query, 0)]
    verifier = float_verifier(tiny_verifier)
    load_federated_state(verifier, split_verifier(sent.to_torch_state_dict())[1])  # type: ignore[arg-type]
    model = SentenceTransformer(str(tiny_dir), device="cpu")
    load_federated_state(model, split_verifier(sent.to_torch_state_dict())[0])
    wrong = np.array([w for _, _, w in asked] + [False], dtype=float)
    weights = np.array([1.0, 2.0, 1.0, 2.0, 1.0])
    expected = (BoundEvidence.of_labels(pair_probabilities(verifier, pairs), wrong, weights),
                BoundEvidence.of_labels(pair_similarities(model, for_encoder(pairs)), wrong,
                                        weights))
    got = (BoundEvidence.from_metrics(reply.content["metrics"]),
           BoundEvidence.from_metrics(reply.content["metrics"], COSINE_KEYS))
    for sums, want in zip(got, expected, strict=True):
        assert sums.labels == 5 and sums.wrong.sum() == pytest.approx(3.0)
        for key in ("count", "weight", "squares", "wrong"):
            np.testing.assert_allclose(getattr(sums, key), getattr(want, key))
    assert np.flatnonzero(got[0].count).tolist() != [int(0.97 * BINS)]  # scored anew
    settings = load_settings(data_dir=tmp_path)
    assert latest_checkpoint(settings.global_model_dir) is None  # M was not kept
    store = EntryStore(tmp_path / "cache")  # the labels went: a train round sends none anew
    try:
        assert Learned(store, 0.02).unsent == 0
    finally:
        store.close()


def _publish(root: Path, tiny: SentenceTransformer, verifier_dir: Path) -> None:
    save_checkpoint(root, 1, _global(tiny, verifier_dir, nudge=0.05), 0.8, "base", 1,
                    sign=partial(sign, key=server_key(root)),
                    verifier_base=read_card(verifier_dir).sha256)


def test_sync_installs_a_signed_global_verifier_and_refuses_an_altered_one(
    tmp_path: Path, tiny: SentenceTransformer, tiny_verifier: Path,
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # This device's shipped verifier is the tiny one.
    monkeypatch.setattr("meancache.shared.verifier.federated.ARTEFACT_DIR", tiny_verifier)
    server = tmp_path / "server"
    _publish(server, tiny, tiny_verifier)
    user = load_settings(config_dir=tmp_path / "cfg", data_dir=tmp_path / "user", environ={}
                         ).model_copy(update={"fl_server_public_key": str(server / PUBLIC_KEY)})
    with serving(create_model_app(server)) as url:
        result = sync_global_model(url, user)
    assert result.changed
    assert load_device_verifier(user) is not None

    # A checkpoint whose verifier_base was changed after signing is refused whole.
    other = tmp_path / "other"
    _publish(other, tiny, tiny_verifier)
    meta_path = latest_checkpoint(other) / META  # type: ignore[operator]
    meta = json.loads(meta_path.read_text())
    meta_path.write_text(json.dumps(meta | {"verifier_base": "f" * 64}))
    newcomer = load_settings(config_dir=tmp_path / "cfg2", data_dir=tmp_path / "new",
                             environ={}).model_copy(update={
                                 "fl_server_public_key": str(other / PUBLIC_KEY)})
    with serving(impostor_endpoint(other)) as url, pytest.raises(
            CheckpointError, match="not signed by the FL server's key"):
        sync_global_model(url, newcomer)
    assert latest_checkpoint(newcomer.global_model_dir) is None
    assert load_device_verifier(newcomer) is None


def test_a_global_verifier_from_another_base_is_not_used(
    tmp_path: Path, tiny: SentenceTransformer, tiny_verifier: Path
) -> None:
    """Signed and fresh, but trained over an int8 verifier this device does not have (its
    shipped one is the real one): installed for the encoder, the verifier kept."""
    server = tmp_path / "server"
    _publish(server, tiny, tiny_verifier)
    user = load_settings(config_dir=tmp_path / "cfg", data_dir=tmp_path / "user", environ={}
                         ).model_copy(update={"fl_server_public_key": str(server / PUBLIC_KEY)})
    with serving(create_model_app(server)) as url:
        assert sync_global_model(url, user).changed
    assert load_device_verifier(user) is None
