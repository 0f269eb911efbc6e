"""Federated learning: weights, checkpoints, the ClientApp on a device (privacy: what
crosses the wire), the threshold-aware FedAvg, the Flower app and its typed run config, and
a simulation on the engine (Ray) through `flwr run`."""

import io
import re
import tomllib
import zipfile
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from meancache.client.cache.store import EntryStore
from meancache.client.config import load_settings
from meancache.client.fl.client_app import app as client_app
from meancache.client.fl.client_app import wire_audit_mod
from meancache.client.fl.device import DeviceState
from meancache.client.learning.bound import Label
from meancache.client.learning.state import Learned
from meancache.fl_server.app_declaration import default_run_config, write_app
from meancache.fl_server.pooled_threshold import ThresholdRule
from meancache.fl_server.run_config import ServerConfig
from meancache.fl_server.screening import ReplyLimits
from meancache.fl_server.server_commands import simulation_config
from meancache.fl_server.simulate import SimulationConfig, simulate
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.encoder import Encoder, load_sentence_transformer, packaged_minilm_dir
from meancache.shared.encoder.weights import encoder_tensors
from meancache.shared.errors import (
    CheckpointError,
    EncoderError,
    FlowerCommandError,
    RunConfigError,
)
from meancache.shared.fl.bound_evidence import (
    COSINE_KEYS,
    ROUND_COSINE_JUDGE,
    ROUND_JUDGE,
    BoundEvidence,
    cosine_judge,
)
from meancache.shared.fl.bound_evidence import KEYS as BOUND_KEYS
from meancache.shared.fl.checkpoint import (
    latest_checkpoint,
    load_checkpoint,
    read_meta,
    round_dir,
    save_checkpoint,
)
from meancache.shared.fl.client_config import ClientConfig
from meancache.shared.fl.evidence import KEYS as EVIDENCE_KEYS
from meancache.shared.fl.evidence import Evidence
from meancache.shared.fl.signing import PUBLIC_KEY, read_public_key, verify
from meancache.shared.fl.weights import (
    VERIFIER,
    federated_names,
    federated_state,
    federated_subset,
    load_federated_state,
    split_verifier,
    verifier_names,
    with_verifier,
)
from meancache.shared.verifier.dequantise import float_verifier
from meancache.shared.verifier.runtime import read_card
from sentence_transformers import SentenceTransformer

from meancache.cli import build_parser, load_side, main
from tests.support.fl import (
    FEEDBACK,
    device_context,
    device_with_feedback,
    message,
    round_message,
    train_message,
    trust_round_key,
    weights_sent,
    wire_bound,
)
from tests.support.paths import DATA_DIR

DATA = DATA_DIR


# weights and checkpoints ------------------------------------------------------------------
def test_top_layers_select_the_last_layers_and_pooler(tiny: SentenceTransformer) -> None:
    everything = federated_names(tiny, 0)
    top = federated_names(tiny, 1)
    assert set(top) < set(everything)
    assert all(".encoder.layer.1." in n or ".pooler." in n for n in top)
    assert any(".pooler." in n for n in top) and not any(".layer.0." in n for n in top)


@pytest.mark.parametrize("which", ["tiny", "minilm"])
def test_the_servers_weights_are_the_pipelines_without_building_it(
        which: str, tiny_dir: Path) -> None:
    """The ServerApp reads the encoder's tensors from its files (shared.encoder.weights):
    every name, shape and value a device's built pipeline holds, for a device must load
    the global model by those names."""
    model_dir = tiny_dir if which == "tiny" else packaged_minilm_dir()
    model = load_sentence_transformer(model_dir)
    read = encoder_tensors(model_dir)
    for top_layers in (0, 1):
        assert set(federated_subset(read, top_layers)) == set(
            federated_names(model, top_layers))
    built = dict(model.named_parameters())
    assert set(built) <= set(read)
    for name, value in built.items():
        assert read[name].dtype == value.dtype and torch.equal(read[name], value), name


def test_an_encoder_directory_without_weights_is_named(tmp_path: Path) -> None:
    (tmp_path / "modules.json").write_text(
        '[{"idx": 0, "name": "0", "path": "", '
        '"type": "sentence_transformers.models.Transformer"}]')
    with pytest.raises(EncoderError, match=re.escape(str(tmp_path))):
        encoder_tensors(tmp_path)
    (tmp_path / "modules.json").write_text("[{")
    with pytest.raises(EncoderError, match="modules"):
        encoder_tensors(tmp_path)


def test_checkpoints_are_verified_and_latest_moves(tmp_path: Path,
                                                   tiny: SentenceTransformer) -> None:
    state = federated_state(tiny, federated_names(tiny, 1))
    save_checkpoint(tmp_path, 1, state, 0.9, "base", 1, {"f05": 0.5})
    second = save_checkpoint(tmp_path, 2, state, 0.8, "base", 1)
    latest = latest_checkpoint(tmp_path)
    assert latest is not None and latest.name == "round-0002"
    meta, loaded = load_checkpoint(latest)
    assert meta == second and meta.threshold == 0.8
    assert all(torch.equal(loaded[k], state[k]) for k in state)
    weights = latest / "weights.safetensors"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint(latest)


def test_encoder_with_global_weights_has_its_own_version(tmp_path: Path, tiny_dir: Path,
                                                         tiny: SentenceTransformer) -> None:
    base = Encoder.load(tiny_dir, backend="torch")
    names = federated_names(tiny, 1)
    changed = {k: v + 0.01 for k, v in federated_state(tiny, names).items()}
    save_checkpoint(tmp_path, 1, changed, 0.9, base.base_version, 1)
    tuned = Encoder.load(tiny_dir, backend="torch", global_weights=latest_checkpoint(tmp_path))
    assert tuned.version != base.version and tuned.base_version != base.base_version
    # the packaged model under the global weights stays named (the decision card's check)
    assert tuned.model_version == base.model_version == base.base_version
    assert tuned.with_pca(None).model_version == base.model_version
    text = ["how do I learn to swim"]
    assert not np.allclose(tuned.encode(text), base.encode(text))
    save_checkpoint(tmp_path / "other", 1, changed, 0.9, "another-base", 1)
    with pytest.raises(EncoderError, match="trained from base model another-base"):
        Encoder.load(tiny_dir, backend="torch",
                     global_weights=latest_checkpoint(tmp_path / "other"))


def test_global_weights_run_from_their_checked_export_at_the_next_start(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the export of base + global weights passed its check, a start runs it without
    loading either; the export of the base model alone is another file, never used for it."""
    base = Encoder.load(tiny_dir, backend="torch")
    changed = {k: v + 0.01 for k, v in federated_state(tiny, federated_names(tiny, 1)).items()}
    save_checkpoint(tmp_path / "global", 1, changed, 0.9, base.base_version, 1)
    checkpoint = latest_checkpoint(tmp_path / "global")
    cache_dir = tmp_path / "encoder"
    first = Encoder.load(tiny_dir, cache_dir=cache_dir, global_weights=checkpoint)
    plain = Encoder.load(tiny_dir, cache_dir=cache_dir)
    assert first.backend == plain.backend == "onnx"

    def no_pytorch(*args: object) -> None:
        raise AssertionError("a checked export was loaded through PyTorch")

    monkeypatch.setattr("meancache.shared.encoder.encoder.load_sentence_transformer",
                        no_pytorch)
    again = Encoder.load(tiny_dir, cache_dir=cache_dir, global_weights=checkpoint)
    assert again.version == first.version != plain.version
    assert again.model_version == plain.model_version  # from the checked export too
    text = ["how do I learn to swim", "what is the capital of France"]
    tuned, untuned = again.encode(text), plain.encode(text)
    np.testing.assert_allclose((tuned * first.encode(text)).sum(1), 1.0, atol=1e-6)
    assert not np.allclose(tuned, untuned)


# the ClientApp on a device ----------------------------------------------------------------


def test_a_device_replies_in_the_order_the_server_sent_its_weights(
    tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ServerApp sends the tensors in its files' order, not the pipeline's; under
    central DP Flower's clipping mod pairs the reply's tensors with the sent ones by
    position, so the device's reply keeps the sent order (else the round fails)."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    trust_round_key(monkeypatch)
    device_with_feedback(tmp_path, FEEDBACK)
    read = encoder_tensors(tiny_dir)
    sent = federated_subset(read, 1)
    request = round_message(ArrayRecord({n: read[n] for n in sent}), 0.8, 2)
    assert sent != federated_names(load_sentence_transformer(tiny_dir), 1)  # the premise
    request.content["config"]["clipping_norm"] = 10.0
    reply = client_app(request, device_context(
        tmp_path, tiny_dir, {"verifier-top-layers": 0, "update-bits": 0}))
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    assert list(reply.content["arrays"]) == sent


def test_device_training_sends_only_weights_counts_and_similarity_evidence(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    trust_round_key(monkeypatch)
    device_with_feedback(tmp_path, FEEDBACK)
    store = EntryStore(tmp_path / "cache")  # and the error bound's labels, one wrong
    learned = Learned(store, 0.02, judge="an older verifier")
    for i in range(5):  # scored by a verifier the round does not pool: not sent
        learned.learn(Label(0.9, True, entry=f"o{i}"))
    learned.judge = "the round's verifier"
    for i in range(30):
        learned.learn(Label(0.5 + i / 100, i == 4, 0.5 if i % 2 else 1.0, entry=f"e{i}"))
    learned.judge = cosine_judge("the round's encoder")  # a cache with the verifier off
    for i in range(12):
        learned.learn(Label(0.8 + i / 100, i < 3, entry=f"c{i}"))
    learned.judge = cosine_judge("its own PCA space")  # a space no other device shares
    for i in range(7):
        learned.learn(Label(0.9, False, entry=f"p{i}"))
    store.close()
    request = train_message(tiny, 1)
    request.content["config"][ROUND_JUDGE] = "the round's verifier"
    request.content["config"][ROUND_COSINE_JUDGE] = cosine_judge("the round's encoder")
    reply = client_app(request, device_context(tmp_path, tiny_dir))
    assert not reply.has_error(), reply.error if reply.has_error() else ""
    content = reply.content
    assert set(content.array_records) == {"arrays"}
    assert not content.config_records
    assert set(content["metrics"]) == {"num-examples", "train-loss", "skipped", *EVIDENCE_KEYS,
                                       *BOUND_KEYS, *COSINE_KEYS}
    bound = BoundEvidence.from_metrics(content["metrics"])  # its labels as sums per bin
    assert (bound.labels, bound.weight.sum(), bound.wrong.sum()) == (30, 45.0, 1.0)
    cosine = BoundEvidence.from_metrics(content["metrics"], COSINE_KEYS)  # and the cosine's
    assert (cosine.labels, cosine.weight.sum(), cosine.wrong.sum()) == (12, 12.0, 3.0)
    assert content["metrics"]["num-examples"] > 0 and content["metrics"]["skipped"] == 0
    # its validation pairs (a fifth of 24), as counts per similarity bin
    assert Evidence.from_metrics(content["metrics"]).pairs == 24 - int(24 * 0.8)
    wire = b"".join(o.deflate() for o in get_all_nested_objects(reply).values())
    for q1, q2, _ in FEEDBACK:  # no query text crosses the wire
        assert q1.encode() not in wire and q2.encode() not in wire
    assert b"cook rice" not in wire and b"capital of" not in wire
    assert set(weights_sent(reply, request)) == set(federated_names(tiny, 1))
    # The device kept the global model it was sent (round 3 starts from round 2's model).
    kept = latest_checkpoint(tmp_path / "fl" / "global")
    assert kept is not None and kept.name == "round-0002"
    store = EntryStore(tmp_path / "cache")
    assert store.get_meta("threshold.global") == pytest.approx(0.8)
    store.close()


def test_a_device_with_too_little_data_trains_nothing_and_says_so(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK[:3])
    sent = train_message(tiny, 1, threshold=0.77)
    reply = client_app(sent, device_context(tmp_path, tiny_dir))
    metrics = reply.content["metrics"]
    assert metrics["num-examples"] == 0 and metrics["skipped"] == 1
    assert Evidence.from_metrics(metrics).pairs == 0
    echoed = weights_sent(reply, sent)
    original = sent.content["arrays"].to_torch_state_dict()
    assert all(np.array_equal(echoed[k], original[k].numpy()) for k in original)


def test_a_device_trains_on_the_pairs_of_every_proxy_cache_and_sets_their_tau(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Feedback given through `meancache proxy` (two apps' caches) trains as the chat's
    does: too few pairs in the chat's cache alone, enough with the apps'."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    trust_round_key(monkeypatch)
    device_with_feedback(tmp_path, FEEDBACK[:3])
    device_with_feedback(tmp_path, FEEDBACK[3:13], cache="key-one/0000000000000000")
    device_with_feedback(tmp_path, FEEDBACK[13:], cache="app-notes/0000000000000001")
    reply = client_app(train_message(tiny, 1, threshold=0.77),
                       device_context(tmp_path, tiny_dir))
    metrics = reply.content["metrics"]
    assert metrics["skipped"] == 0 and metrics["num-examples"] == int(24 * 0.8)
    assert Evidence.from_metrics(metrics).pairs == 24 - int(24 * 0.8)
    for cache in (tmp_path / "cache", *sorted((tmp_path / "proxy").glob("*/*/cache"))):
        store = EntryStore(cache)
        assert store.get_meta("threshold.global") == pytest.approx(0.77), cache
        store.close()


def test_the_wire_audit_refuses_anything_but_weights_and_counts() -> None:
    request = message(RecordDict({"config": ConfigRecord({"threshold": 0.8})}))

    def leaky(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"metrics": MetricRecord({"num-examples": 1}),
                                   "oops": ConfigRecord({"query": "my secret question"})}),
                       reply_to=msg)

    context = Context(run_id=1, node_id=7, node_config={}, state=RecordDict(), run_config={})
    with pytest.raises(PermissionError, match="may not leave the device"):
        wire_audit_mod(request, context, leaky)


# server aggregation -----------------------------------------------------------------------
def test_fedavg_weights_by_examples_pools_evidence_and_ignores_idle_devices() -> None:
    rule = ThresholdRule(prior_pairs=0, min_pairs=10, max_step=1.0)
    strategy = ThresholdFedAvg(0.8, ArrayRecord({"w": torch.zeros(2)}),
                               ReplyLimits(10**6, 1e6), rule, min_train_nodes=1,
                               min_available_nodes=1)

    def reply(dst: int, value: float, examples: int, evidence: Evidence) -> Message:
        sent = message(RecordDict({"config": ConfigRecord({})}), dst=dst)
        return Message(RecordDict({
            "arrays": ArrayRecord({"w": torch.full((2,), value)}),
            "metrics": MetricRecord({"num-examples": examples, "train-loss": 0.0,
                                     "skipped": int(examples == 0),
                                     **evidence.to_metrics()})}),
            reply_to=sent)

    # duplicates at 0.902 and distinct pairs at 0.702 on one device, at 0.862 on the
    # other: only a threshold between them separates the pooled pairs
    first = Evidence.of_pairs(np.array([0.902] * 10 + [0.702] * 10),
                              np.array([1] * 10 + [0] * 10))
    second = Evidence.of_pairs(np.array([0.862] * 10), np.zeros(10))
    arrays, metrics = strategy.aggregate_train(1, [reply(1, 1.0, 30, first),
                                                   reply(2, 4.0, 10, second),
                                                   reply(3, 99.0, 0, Evidence.empty())])
    assert arrays is not None and metrics is not None
    # 30 examples weigh as the round's median count, 20, and 20 pairs of evidence as
    # 15 (fl_server.screening)
    assert torch.allclose(arrays.to_torch_state_dict()["w"], torch.full((2,), 2.0))
    assert 0.862 < strategy.threshold <= 0.902 and metrics["threshold"] == strategy.threshold
    assert strategy.pooled[1].pairs == 15 + 10 and not set(EVIDENCE_KEYS) & set(metrics)
    assert set(strategy.bytes_received[1]) == {1, 2, 3}
    moved = strategy.threshold
    none, _ = strategy.aggregate_train(2, [reply(4, 5.0, 0, Evidence.empty())])
    assert none is None and strategy.threshold == moved


# the Flower app and its run config --------------------------------------------------------
def test_the_fab_of_a_run_holds_no_code_and_names_the_installed_version(
    tmp_path: Path
) -> None:
    from flwr.cli.build import build_fab_from_disk

    fab = zipfile.ZipFile(io.BytesIO(build_fab_from_disk(write_app(tmp_path))))
    names = fab.namelist()
    assert "pyproject.toml" in names
    assert not [name for name in names if name.endswith(".py")], names
    declared = tomllib.loads(fab.read("pyproject.toml").decode())
    assert declared["project"]["version"] == version("meancache")
    assert declared["tool"]["flwr"]["app"]["components"]["clientapp"] == (
        "meancache.client.fl.client_app:app")


def test_the_run_config_is_typed_from_the_app_defaults() -> None:
    defaults = default_run_config()
    server = ServerConfig.from_run_config({**defaults, "checkpoint-dir": "/tmp/ckpt",
                                           "round-timeout": 300})
    assert server.round_timeout == 300.0 and server.checkpoint_dir == Path("/tmp/ckpt")
    assert server.held_out_path is None and server.model.encoder_model is None
    client = ClientConfig.from_run_config(defaults)
    assert client.data_source == "device" and client.train.epochs == defaults["epochs"]
    assert client.model == server.model  # both sides read the same shared keys
    # the rank a device sends is the highest the server decodes
    assert client.update_rank == server.limits.max_update_rank == defaults["update-rank"]


@pytest.mark.parametrize(("side", "key", "value", "message"), [
    (ServerConfig, "top-layers", -1, "run config 'top-layers' must be >= 0, not -1"),
    (ClientConfig, "train-encoder", 2, "run config 'train-encoder' must be 0 or 1, not 2"),
    (ServerConfig, "fraction-train", "all",
     "run config 'fraction-train' must be a number, not 'all'"),
    (ServerConfig, "fraction-train", 1.5, "run config 'fraction-train' must be between 0 and 1"),
    (ClientConfig, "epochs", True, "run config 'epochs' must be an integer, not True"),
    (ClientConfig, "update-rank", -1, "run config 'update-rank' must be >= 0, not -1"),
    (ServerConfig, "update-rank", 1.5, "run config 'update-rank' must be an integer, not 1.5"),
    (ClientConfig, "data-source", "disk",
     "run config 'data-source' must be one of 'device', 'qqp', not 'disk'"),
    (ClientConfig, "data-source", "qqp", "'qqp-path' must name a labelled-pairs file"),
])
def test_the_run_config_rejects_a_bad_value_naming_its_key(
    side: type[ServerConfig] | type[ClientConfig], key: str, value: object, message: str
) -> None:
    config = {**default_run_config(), "checkpoint-dir": "/tmp/ckpt", key: value}
    with pytest.raises(RunConfigError, match=re.escape(message)):
        side.from_run_config(config)


def test_a_run_config_from_another_version_is_refused() -> None:
    config = dict(default_run_config())
    del config["min-pairs"]
    with pytest.raises(RunConfigError, match="no 'min-pairs'.*another meancache version"):
        ClientConfig.from_run_config(config)
    with pytest.raises(RunConfigError, match="'checkpoint-dir' must name"):
        ServerConfig.from_run_config(default_run_config())


# simulation on the engine -----------------------------------------------------------------
@pytest.mark.slow(45)
def test_simulation_runs_rounds_and_checkpoints(tmp_path: Path, tiny_dir: Path,
                                                tiny_verifier: Path) -> None:
    """The encoder and the verifier (its top layer and head) trained and averaged
    together, each round's global model of both signed."""
    seen: list[int] = []
    rows = simulate(SimulationConfig(
        pairs=DATA / "qqp" / "pairs.jsonl", checkpoint_dir=tmp_path / "ckpt", clients=3,
        per_round=2, workers=1, run_config={"num-server-rounds": 2, "pairs-per-client": 40,
                                 "top-layers": 1, "encoder-model": str(tiny_dir),
                                 "verifier-top-layers": 1,
                                 "verifier-model": str(tiny_verifier),
                                 "held-out-pairs": 60}),
        tmp_path / "flwr-home", on_round=lambda row: seen.append(int(row["round"])))
    assert [int(r["round"]) for r in rows] == [0, 1, 2]
    assert seen == [0, 1, 2]  # progress came round by round
    assert (tmp_path / "flwr-home" / "apps").is_dir()  # Flower's home is ours
    assert all(r["clients"] == 2 and r["bytes_per_client"] > 0 for r in rows[1:])
    # each device sent its 4-bit update (the default), within the bound of the layers' size
    model = SentenceTransformer(str(tiny_dir), device="cpu")
    verifier = float_verifier(tiny_verifier)
    initial = with_verifier(federated_state(model, federated_names(model, 1)),
                            federated_state(verifier, verifier_names(verifier, 1)))  # type: ignore[arg-type]
    trained = {name: tuple(value.shape) for name, value in initial.items()}
    judged = {name: n for name, n in trained.items() if name.startswith(VERIFIER)}
    assert all(r["bytes_per_client"] <= wire_bound(trained, 4) for r in rows[1:])
    assert all(0 < r["verifier_bytes_per_client"] <= wire_bound(judged, 4) for r in rows[1:])
    assert rows[1]["evidence_pairs"] > 0  # devices' similarity evidence came back
    # and their error-bound evidence: each device's validation pairs as labels, scored by
    # the global verifier, pooled, and published with the round's model (signed below)
    validation = 40 - int(40 * 0.8)
    assert rows[0]["bound_labels"] == 0
    assert rows[1]["bound_labels"] == rows[2]["bound_labels"] == 2 * validation
    assert all({"f05", "f1", "precision", "recall"} <= set(r) for r in rows)
    latest = latest_checkpoint(tmp_path / "ckpt")
    assert latest is not None
    meta, state = load_checkpoint(latest)
    assert meta.round == 2 and meta.threshold == pytest.approx(rows[2]["threshold"])
    verify(meta, read_public_key(str(tmp_path / "ckpt" / PUBLIC_KEY)))  # the server signed it
    # each round's pool names the verifier its labels were scored by: round 1's the int8
    # base the devices were sent
    first = read_meta(round_dir(tmp_path / "ckpt", 1))
    assert BoundEvidence.from_record(first.bound).labels == 2 * validation
    assert BoundEvidence.from_record(first.bound).judge == read_card(tiny_verifier).sha256
    # the cosine's labels likewise (the same pairs scored by the global encoder), naming
    # the space a device's encoder is in with the model it was sent: the base model's
    assert rows[0]["cosine_bound_labels"] == 0
    assert rows[1]["cosine_bound_labels"] == rows[2]["cosine_bound_labels"] == 2 * validation
    assert BoundEvidence.from_record(first.cosine_bound).judge == cosine_judge(
        Encoder.load(tiny_dir, backend="torch").version)
    # the final model's pools come from the evidence round after the last (all three
    # devices, nothing trained), scored by its own judges: the verifier a device makes
    # from it goes by its sha256 (test_fl_verifier), the cosine by the space its weights
    # put the encoder in; round 2's training scored with round 1's model, whose judges
    # no device running the final model has
    final = round_dir(tmp_path / "ckpt", 2)
    pools = BoundEvidence.from_record(meta.bound), BoundEvidence.from_record(
        meta.cosine_bound)
    space = Encoder.load(tiny_dir, backend="torch", global_weights=final).version
    assert [(p.labels, p.judge) for p in pools] == [(3 * validation, meta.sha256),
                                                    (3 * validation, cosine_judge(space))]
    assert meta.metrics["evidence_round_replies"] == 3
    assert meta.metrics["evidence_round_bytes_received"] > 0
    # and a cache running the final model's judges applies them: its bound counts them
    # (its prior at 0, so that every pooled label lies in the tail the bound reads)
    device = load_settings(config_dir=tmp_path / "device" / "cfg", data_dir=tmp_path / "device",
                           environ={})
    DeviceState(device).set_pooled_bound(meta.bound, meta.cosine_bound)
    store = EntryStore(device.cache_dir)
    try:
        for judge in (meta.sha256, cosine_judge(space)):
            assert Learned(store, 0.02, prior=0.0, judge=judge).bound.pooled == 3 * validation
    finally:
        store.close()
    assert meta.verifier_base == read_card(tiny_verifier).sha256 and set(state) == set(initial)
    assert rows[1]["rejected"] == 0  # honest devices pass the screening
    assert "epsilon" not in rows[1]  # no privacy is claimed without DP
    for sent, learned in zip(split_verifier(initial), split_verifier(state), strict=True):
        assert any(not torch.equal(learned[k], v) for k, v in sent.items())  # both learned
    load_federated_state(model, split_verifier(state)[0])


def test_simulate_never_deletes_a_directory_it_did_not_create(tmp_path: Path) -> None:
    mine = tmp_path / "thesis"
    mine.mkdir()
    (mine / "chapter1.tex").write_text("years of work")
    config = SimulationConfig(pairs=DATA / "qqp" / "pairs.jsonl", checkpoint_dir=mine,
                              clients=2, per_round=2)
    with pytest.raises(FlowerCommandError, match="was not made by `meancache fl simulate`"):
        simulate(config, tmp_path / "flwr-home")
    assert (mine / "chapter1.tex").read_text() == "years of work"


@pytest.mark.parametrize(("option", "value", "allowed"), [
    ("--workers", "-1", "0 or more"), ("--rounds", "0", "1 or more"),
    ("--learning-rate", "-1", "more than 0"), ("--epochs", "0", "1 or more"),
    ("--dp-noise", "-1", "0 or more"), ("--secure-upload-mb", "-1", "0 or more"),
    ("--clients", "two", None)])
def test_simulate_refuses_a_number_out_of_its_range_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        option: str, value: str, allowed: str | None) -> None:
    """Each once ran: devices failed every round unseen (a negative learning rate, no
    epochs) or the run ended after 0 rounds with a pointer to Flower's log."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    with pytest.raises(SystemExit) as refused:
        main(["--data-dir", str(tmp_path / "data"), "fl", "simulate", "--pairs",
              str(DATA / "qqp" / "pairs.jsonl"), option, value])
    assert refused.value.code == 2
    said = capsys.readouterr().err
    assert f"argument {option}:" in said and "Traceback" not in said
    assert (f"(allowed: {allowed})" if allowed else "is not a whole number") in said
    assert not (tmp_path / "data" / "fl-simulation").exists()  # refused before anything ran


@pytest.mark.parametrize(("rows", "said"), [
    (None, "cannot read {pairs}: No such file or directory"),
    ("", "{pairs} holds no pairs with split 'train'"),
    ('{"q1": "a", "q2": "b", "label": 1, "split": "train"}\n',
     "{pairs} holds no pairs with split 'dev'"),  # what the ServerApp scores on
    ('{"q1": "a", "q2": "b", "label": 1, "split": "train"}\n{"q1": "a"}\n',
     "{pairs}:2: 'q2' must be a non-empty string"),
], ids=["missing", "empty", "no-dev", "broken-row"])
def test_simulate_names_pairs_it_cannot_train_on_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        rows: str | None, said: str) -> None:
    """Such a file started the simulation, which ended after 0 rounds with a pointer to
    Flower's log."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    pairs = tmp_path / "pairs.jsonl"
    if rows is not None:
        pairs.write_text(rows)
    assert main(["--data-dir", str(tmp_path / "data"), "fl", "simulate", "--pairs",
                 str(pairs)]) == 2
    assert said.format(pairs=pairs) in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "data" / "fl-simulation").exists()


def test_simulate_says_when_devices_failed_and_fails_when_none_trained(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows as the ServerApp writes them when every device's ClientApp raised (a fault a
    real run gives only through a bug, so the rows are injected): each round's line says
    how many failed and where to read why, and the command fails rather than print a table
    of rounds that trained nothing."""
    import meancache.fl_server.simulate as engine

    def failing(config: object, home: Path, on_round: Callable[[dict[str, float]], None]
                ) -> list[dict[str, float]]:
        rows = [{"round": 0, "threshold": 0.8, "seconds": 1.0},
                *({"round": r, "threshold": 0.8, "seconds": 1.0, "failed": 2, "rejected": 0}
                  for r in (1, 2))]
        for row in rows:
            on_round(row)
        return rows

    monkeypatch.setattr(engine, "simulate", failing)
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["--data-dir", str(tmp_path / "data"), "fl", "simulate", "--pairs",
                 str(DATA / "qqp" / "pairs.jsonl"), "--clients", "2", "--per-round", "2",
                 "--rounds", "2"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "round 1/2 done" in err and "2 of 2 devices failed (why: " in err
    assert "error: no device trained in any round" in err and "simulation.log" in err


def test_simulate_verifier_only_keeps_the_encoder_out_of_the_rounds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--verifier-only is run config train-encoder = 0 (the verifier alone travels:
    test_fl_verifier checks what that round holds); without it the encoder trains too."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    pairs = str(DATA / "qqp" / "pairs.jsonl")
    for flags, train_encoder in (([], 1), (["--verifier-only"], 0)):
        args = build_parser().parse_args(["--data-dir", str(tmp_path / "data"), "fl",
                                          "simulate", "--pairs", pairs, *flags])
        config = simulation_config(args, load_side(args))
        assert config.full_run_config()["train-encoder"] == train_encoder


def test_simulate_passes_the_secure_upload_cap(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    pairs = str(DATA / "qqp" / "pairs.jsonl")
    args = build_parser().parse_args(["--data-dir", str(tmp_path / "data"), "fl", "simulate",
                                      "--pairs", pairs, "--secure-aggregation",
                                      "--secure-upload-mb", "2.5"])
    config = simulation_config(args, load_side(args)).full_run_config()
    assert (config["secure-aggregation"], config["secure-upload-mb"]) == (1, 2.5)


def test_simulate_verifier_only_needs_a_federated_verifier(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    assert main(["--data-dir", str(tmp_path / "data"), "fl", "simulate", "--pairs",
                 str(DATA / "qqp" / "pairs.jsonl"), "--verifier-only",
                 "--verifier-layers", "0"]) == 2
    assert "--verifier-only federates the verifier alone, so it needs --verifier-layers 1" \
        in capsys.readouterr().err
    assert not (tmp_path / "data" / "fl-simulation").exists()
