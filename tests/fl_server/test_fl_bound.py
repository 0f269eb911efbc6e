"""The error-bound evidence federated learning carries (shared.fl.bound_evidence): a
device's labels as sums per score bin, read back exactly, refused by name when malformed
or when no labels could make them, capped per device, pooled by the server and published
in the signed description of the global model."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import (
    Array,
    ArrayRecord,
    ConfigRecord,
    Message,
    MessageType,
    MetricRecord,
    RecordDict,
)
from flwr.common import Code, FitRes, Status, ndarrays_to_parameters
from flwr.supercore.task_identity import TaskIdentity
from hypothesis import given
from hypothesis import strategies as st
from meancache.fl_server.evidence_round import gather
from meancache.fl_server.pooled_threshold import ThresholdRule
from meancache.fl_server.round_model import RoundModels
from meancache.fl_server.screening import ReplyLimits, screen
from meancache.fl_server.secure_rounds import CountingGrid, SecureFedAvg
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.encoder.fingerprint import space_version
from meancache.shared.encoder.global_weights import global_version
from meancache.shared.fl.bound_evidence import (
    BINS,
    COSINE_KEYS,
    COUNT,
    KEYS,
    MAX_WEIGHT,
    ROUND_COSINE_JUDGE,
    ROUND_JUDGE,
    SQUARES,
    WEIGHT,
    WRONG,
    BoundEvidence,
    cosine_judge,
)
from meancache.shared.fl.checkpoint import DESCRIPTION_KEY, GlobalModel, save_checkpoint
from meancache.shared.fl.evidence import Evidence
from meancache.shared.fl.secure import from_scalars, to_scalars
from meancache.shared.fl.signing import verify

from tests.support.fl import ROUND_KEY, message, reply
from tests.support.fuzz import fuzzed


def labels(n: int, wrong_every: int = 0, seed: int = 0) -> BoundEvidence:
    """``n`` labels scored 0.5 to 1, every ``wrong_every``-th wrong, some explored."""
    rng = np.random.default_rng(seed)
    wrong = np.zeros(n) if not wrong_every else (np.arange(n) % wrong_every == 0)
    return BoundEvidence.of_labels(rng.uniform(0.5, 1, n), wrong.astype(float),
                                   rng.choice([1.0, 10.0, 20.0], n))


def test_evidence_reads_back_exactly_from_a_reply_a_secagg_reply_and_the_record() -> None:
    sent = labels(300, wrong_every=7)
    assert sent.labels == 300
    both = {**sent.to_metrics(), **labels(40, seed=9).to_metrics(COSINE_KEYS)}
    assert BoundEvidence.from_metrics(both, COSINE_KEYS).labels == 40  # the cosine's set
    for back in (BoundEvidence.from_metrics(sent.to_metrics()),
                 BoundEvidence.from_metrics(from_scalars(to_scalars(both))),
                 BoundEvidence.from_metrics(from_scalars(to_scalars(
                     sent.to_metrics(COSINE_KEYS))), COSINE_KEYS),
                 BoundEvidence.from_record(json.loads(json.dumps(sent.to_record())))):
        for a, b in zip((back.count, back.weight, back.squares, back.wrong),
                        (sent.count, sent.weight, sent.squares, sent.wrong), strict=True):
            assert np.array_equal(a, b)
    # a reply without any of its keys (a device that learned nothing, an older one) has none
    assert BoundEvidence.from_metrics({"num-examples": 3}).labels == 0
    # the record holds only the bins with labels
    assert len(sent.to_record()["bins"]) == np.count_nonzero(sent.count) < BINS


CORRUPTIONS = {
    "missing": (lambda m, k, i: m.pop(k), "must be a list of 256 numbers"),
    "short": (lambda m, k, i: m.__setitem__(k, m[k][:-1]), "must be a list of 256 numbers"),
    "text": (lambda m, k, i: m[k].__setitem__(i, "7"), "must hold numbers"),
    "boolean": (lambda m, k, i: m[k].__setitem__(i, True), "must hold numbers"),
    "negative": (lambda m, k, i: m[k].__setitem__(i, -1.0), "finite numbers >= 0"),
    "nan": (lambda m, k, i: m[k].__setitem__(i, float("nan")), "finite numbers >= 0"),
    "infinite": (lambda m, k, i: m[k].__setitem__(i, float("inf")), "finite numbers >= 0"),
}


@fuzzed()
@given(st.sampled_from(sorted(CORRUPTIONS)), st.sampled_from((*KEYS, *COSINE_KEYS)),
       st.integers(0, BINS - 1), st.integers(0, 2**16))
def test_a_malformed_reply_is_refused_naming_its_key(corruption: str, key: str, index: int,
                                                     seed: int) -> None:
    """The verifier's sums and the cosine's alike."""
    keys = KEYS if key in KEYS else COSINE_KEYS
    metrics = labels(200, wrong_every=9, seed=seed).to_metrics(keys)
    corrupt, message = CORRUPTIONS[corruption]
    corrupt(metrics, key, index)
    with pytest.raises(ValueError, match="bound evidence is malformed") as raised:
        BoundEvidence.from_metrics(metrics, keys)
    assert f"'{key}'" in str(raised.value) and message in str(raised.value)


INCONSISTENT = [  # (key, value in a bin holding 4 labels of weight 1, what is named)
    (COUNT, 2.5, "whole numbers"),
    (WEIGHT, 3.0, "between its count and"),  # below one per label
    (WEIGHT, 4 * MAX_WEIGHT + 1, "between its count and"),  # a labelling chance < 1e-3
    (SQUARES, 3.0, "between weight²/count"),  # four weights summing to 4 have w² >= 4
    (WRONG, 5.0, "wrong weight must not exceed"),
]


@pytest.mark.parametrize("keys", [KEYS, COSINE_KEYS], ids=["verifier", "cosine"])
@pytest.mark.parametrize(("key", "value", "named"), INCONSISTENT)
def test_sums_no_labels_could_make_are_refused_naming_the_rule(key: str, value: float,
                                                               named: str,
                                                               keys: tuple[str, ...]) -> None:
    metrics = BoundEvidence.of_labels(np.full(4, 0.75), np.zeros(4), np.ones(4)).to_metrics(
        keys)
    metrics[keys[KEYS.index(key)]][192] = value
    with pytest.raises(ValueError, match=named):
        BoundEvidence.from_metrics(metrics, keys)
    weight_alone = BoundEvidence.empty().to_metrics()
    weight_alone[WEIGHT][3] = 1.0  # weight in a bin without labels
    with pytest.raises(ValueError, match="without labels must hold no weight"):
        BoundEvidence.from_metrics(weight_alone)


def test_the_server_drops_a_liar_caps_a_big_device_pools_and_publishes_signed() -> None:
    """Screening refuses impossible sums by name and holds one device to the round's
    median number of labels (every sum scaled alike, so its error share stays); the
    round's sum is what the next description of the global model carries, signed. The
    cosine's labels are a second set, screened, capped and published alike, under the
    cosine's name."""
    state = {"w": torch.zeros(2)}
    strategy = ThresholdFedAvg(0.8, ArrayRecord(state), ReplyLimits(10**6, 1e6),
                               ThresholdRule(0, 10, 1.0),
                               models=RoundModels(ROUND_KEY, "base", 1, 0,
                                                  shipped_judge="shipped"),
                               min_train_nodes=1, min_available_nodes=1)
    strategy.judges[1] = "shipped"  # as configure_train names them (test_fl.py's simulation)
    strategy.cosine_judges[1] = cosine_judge("space")
    similarity = Evidence.empty().to_metrics()
    big, small, third = labels(900, wrong_every=50, seed=1), labels(100, seed=2), \
        labels(300, seed=3)
    cosines = [labels(50, seed=5), labels(500, wrong_every=10, seed=6), labels(200, seed=7)]
    liar = labels(100, seed=4).to_metrics()
    liar[COUNT][255] += 5000  # 5,000 right labels with no weight: impossible
    cosine_liar = labels(100, seed=8).to_metrics(COSINE_KEYS)
    cosine_liar[COSINE_KEYS[1]][255] += 1000 * MAX_WEIGHT  # more weight than its labels'
    replies = [reply(n, {**similarity, **verifier.to_metrics(), **cosine.to_metrics(
                   COSINE_KEYS)}, 10, torch.ones(2))
               for n, verifier, cosine in zip((1, 2, 3), (big, small, third), cosines,
                                             strict=True)]
    replies += [reply(4, {**similarity, **liar}, 10, torch.ones(2)),
                reply(5, {**similarity, **small.to_metrics(), **cosine_liar}, 10,
                      torch.ones(2))]
    screened = screen([m for m in replies], ArrayRecord(state), ReplyLimits(10**6, 1e6))
    assert "bound evidence is inconsistent" in screened.rejected[4]
    assert "bound evidence is inconsistent" in screened.rejected[5]  # the cosine's set
    assert [e.labels for e in screened.bound] == [300, 100, 300]  # median of 900, 100, 300
    assert screened.clamped_bound == 1
    assert [e.labels for e in screened.cosine_bound] == [50, 200, 200]  # median 200
    assert screened.clamped_cosine_bound == 1
    capped = screened.bound[0]
    assert capped.wrong.sum() / capped.weight.sum() == pytest.approx(
        big.wrong.sum() / big.weight.sum())
    capped = screened.cosine_bound[1]
    assert capped.wrong.sum() / capped.weight.sum() == pytest.approx(
        cosines[1].wrong.sum() / cosines[1].weight.sum())
    strategy.aggregate_train(1, replies)
    assert strategy.bound.labels == 700 and strategy.cosine_bound.labels == 450
    config = ConfigRecord({})
    strategy._describe(config, 1, ArrayRecord(state))
    meta = GlobalModel(**json.loads(str(config[DESCRIPTION_KEY])))
    verify(meta, ROUND_KEY.public_key())
    assert BoundEvidence.from_record(meta.bound).labels == 700
    assert BoundEvidence.from_record(meta.bound).judge == "shipped"  # named, signed
    assert BoundEvidence.from_record(meta.cosine_bound).labels == 450
    assert BoundEvidence.from_record(meta.cosine_bound).judge == cosine_judge("space")
    # a round in which no device sends labels keeps what was published, and its judges
    strategy.judges[2], strategy.cosine_judges[2] = "a newer verifier", cosine_judge("new")
    strategy.aggregate_train(2, [reply(6, similarity, 10, torch.ones(2))])
    assert strategy.bound.labels == 700 and strategy.bound.judge == "shipped"
    assert strategy.cosine_bound.labels == 450
    assert strategy.cosine_bound.judge == cosine_judge("space")
    # one in which devices send only the cosine's replaces that pool alone
    strategy.judges[3], strategy.cosine_judges[3] = "a newer verifier", cosine_judge("new")
    strategy.aggregate_train(3, [reply(7, {**similarity, **small.to_metrics(COSINE_KEYS)},
                                       10, torch.ones(2))])
    assert (strategy.bound.labels, strategy.bound.judge) == (700, "shipped")
    assert (strategy.cosine_bound.labels, strategy.cosine_bound.judge) == (
        100, cosine_judge("new"))


class LyingDevices:
    """The grid as the evidence round meets it, each device answering with the metrics
    given (a liar's included: no honest device sends these)."""

    def __init__(self, answers: dict[int, dict[str, object]]) -> None:
        self.answers, self.asked = answers, []

    def get_node_ids(self) -> list[int]:
        return list(self.answers)

    def send_and_receive(self, messages: list[Message], *, timeout: float | None = None
                         ) -> list[Message]:
        self.asked = list(messages)
        return [Message(RecordDict({"metrics": MetricRecord(self.answers[m.metadata.dst_node_id])}),
                        reply_to=message(m.content, kind=m.metadata.message_type,
                                         dst=m.metadata.dst_node_id))
                for m in messages]


def test_the_evidence_round_refuses_and_caps_replies_as_a_training_round_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The final model's evidence round (fl_server.evidence_round) asks every device in
    a query message naming the final model's judges; its replies are checked and capped
    as training replies are (an impossible sum refused by name, a big device held to the
    median, a reply carrying anything but the sums refused), and pooled under those names."""
    for name in ("_run_id", "_node_id", "_task_id"):  # as in a ServerApp's run
        monkeypatch.setattr(TaskIdentity, name, 1)
    liar = labels(100, seed=4).to_metrics()
    liar[COUNT][255] += 5000  # 5,000 right labels with no weight: impossible
    short = labels(100, seed=5).to_metrics(COSINE_KEYS)
    short[COSINE_KEYS[0]] = short[COSINE_KEYS[0]][:10]  # not one number per bin
    big, small, third = labels(900, wrong_every=50, seed=1), labels(100, seed=2), \
        labels(300, seed=3)
    grid = LyingDevices({
        1: {**big.to_metrics(), **labels(50, seed=6).to_metrics(COSINE_KEYS)},
        2: {**small.to_metrics(), **labels(500, seed=7).to_metrics(COSINE_KEYS)},
        3: third.to_metrics(),
        4: liar, 5: short,
        6: {**small.to_metrics(), "precision": 0.9}})  # more than the sums
    published = (labels(40, seed=8).judged_by("the model before"), BoundEvidence.empty())
    arrays = ArrayRecord({"w": Array(np.ones(3, dtype=np.float32))})
    judges = ("the final verifier", cosine_judge("the final space"))
    done = gather(grid, arrays, 0.8, judges, published, ReplyLimits(10**6, 1e6), 30.0)
    assert {m.metadata.message_type for m in grid.asked} == {MessageType.QUERY}
    config = grid.asked[0].content["config"]
    assert (config[ROUND_JUDGE], config[ROUND_COSINE_JUDGE]) == judges
    assert (done.replies, done.rejected) == (3, 3)
    assert done.bound.labels == 300 + 100 + 300  # median of 900, 100, 300
    assert done.bound.judge == "the final verifier"  # replacing the model-before's
    assert done.cosine_bound.labels == 50 + 275  # median of 50 and 500
    assert done.cosine_bound.judge == cosine_judge("the final space")
    assert done.bytes_sent > 3 * 4 and done.bytes_received > 0 and done.seconds >= 0
    # a round whose devices send no labels keeps what was published
    quiet = gather(LyingDevices({1: labels(0).to_metrics()}), arrays, 0.8, judges,
                   published, ReplyLimits(10**6, 1e6), 30.0)
    assert (quiet.bound.labels, quiet.bound.judge) == (40, "the model before")


def test_a_round_names_the_judge_whose_labels_it_pools(tmp_path: Path) -> None:
    """The verifier devices run with the model a round carries: the int8 base for the
    model a run starts from (or an unfederated verifier, the shipped one), a published
    model's own sha256 after it (as a device names the verifier it makes from it); two
    judges' labels never add up, and a record's judge must be a name. The cosine the
    round names is the full space of the encoder devices run with that model: the base
    model alone, then the version a device gives the base with the published weights
    over it (shared.encoder.global_weights, from the checkpoint it installs)."""
    arrays = ArrayRecord({"w": torch.zeros(2)})
    models = RoundModels(ROUND_KEY, "base", 1, 0)
    assert models.cosine_judge(0, arrays) == cosine_judge(space_version("base", None))
    save_checkpoint(tmp_path, 1, arrays.to_torch_state_dict(), 0.8, "base", 1)
    installed = cosine_judge(space_version(global_version("base", tmp_path / "round-0001"),
                                           None))
    assert models.cosine_judge(1, arrays) == installed != models.cosine_judge(0, arrays)
    assert RoundModels(ROUND_KEY, "base", 1, 3).cosine_judge(0, arrays) == installed
    assert models.cosine_judge(1, ArrayRecord({"w": torch.ones(2)})) != installed
    federated = RoundModels(ROUND_KEY, "base", 1, 0, verifier_base="int8-base",
                            shipped_judge="shipped")
    assert federated.judge(0, arrays) == "int8-base"
    assert federated.judge(1, arrays) == json.loads(federated.describe(1, 0.8, arrays))[
        "sha256"]
    assert RoundModels(ROUND_KEY, "base", 1, 3, verifier_base="int8-base").judge(
        0, arrays) == federated.judge(1, arrays)  # a continued run sends a published model
    assert RoundModels(ROUND_KEY, "base", 1, 3, shipped_judge="shipped").judge(
        5, arrays) == "shipped"  # the verifier is not federated: the shipped one judges
    pool = labels(50).judged_by("int8-base")
    with pytest.raises(ValueError, match="two judges do not add up"):
        pool + labels(5).judged_by("another")
    assert (pool + labels(5)).judge == "int8-base"  # a reply's sums name none
    record = pool.to_record()
    assert BoundEvidence.from_record(json.loads(json.dumps(record))).judge == "int8-base"
    with pytest.raises(ValueError, match="'judge' must be a name"):
        BoundEvidence.from_record({**record, "judge": 7})


def test_under_secure_aggregation_the_evidence_is_still_checked_capped_and_pooled() -> None:
    """SecAgg+ hides each update, not the evidence (JSON text in the legacy metrics): a
    device's impossible sums are ignored (its masked update still counts), the others are
    capped at the round's median labels and published with the next round's model."""
    state = {"w": np.zeros(2, dtype=np.float32)}
    strategy = SecureFedAvg(["w"], ArrayRecord({"w": Array(state["w"])}), 0.8,
                            ReplyLimits(10**6, 1e6), ThresholdRule(0, 10, 1.0),
                            RoundModels(ROUND_KEY, "base", 1, 0), CountingGrid(None),
                            lambda r, a: None)
    liar = labels(50, seed=4).to_metrics()
    liar[WRONG][200] = 10**6  # more wrong weight than weight
    similarity = Evidence.empty().to_metrics()

    def fit(bound: dict[str, list[float]], cosine: int) -> tuple[None, FitRes]:
        return None, FitRes(Status(Code.OK, ""), ndarrays_to_parameters([state["w"]]), 10,
                            to_scalars({"num-examples": 10, **similarity,
                                        **labels(cosine, seed=cosine).to_metrics(
                                            COSINE_KEYS), **bound}))
    cosine_liar = labels(100, seed=4).to_metrics(COSINE_KEYS)  # a tampered second set
    cosine_liar[COSINE_KEYS[3]][200] = 10**6
    strategy.aggregate_fit(1, [fit(labels(900, seed=1).to_metrics(), 20),
                               fit(labels(100, seed=2).to_metrics(), 60),
                               fit(labels(300, seed=3).to_metrics(), 600), fit(liar, 60),
                               fit({**labels(100, seed=5).to_metrics(), **cosine_liar}, 0)],
                           [])
    assert strategy.bound.labels == 300 + 100 + 300
    assert strategy.cosine_bound.labels == 60 + 60 + 20  # median 60; the liar's ignored
    config = strategy._fit_config(2)
    assert config[ROUND_COSINE_JUDGE] == strategy.models.cosine_judge(1, ArrayRecord(
        {"w": Array(state["w"])}))
    meta = GlobalModel(**json.loads(str(config[DESCRIPTION_KEY])))
    verify(meta, ROUND_KEY.public_key())
    assert BoundEvidence.from_record(meta.bound).labels == 700
    assert BoundEvidence.from_record(meta.cosine_bound).labels == 140
