"""One device cannot move the global model or threshold far: the server screens every
reply (fl_server.screening) and the device refuses a global model it cannot trust."""

from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, Error, Message, MetricRecord, RecordDict
from meancache.client.fl.client_app import app as client_app
from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.run_config import ServerConfig
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.fl.evidence import BINS, DUPLICATES, Evidence
from sentence_transformers import SentenceTransformer

from tests.support.fl import (
    FEEDBACK,
    around,
    device_context,
    device_with_feedback,
    message,
    reply,
    train_message,
    weights_sent,
)

GLOBAL_TAU = 0.80
SIZE = 6


def defaults(**overrides: object) -> ServerConfig:
    """The server's settings as the Flower app ships them."""
    return ServerConfig.from_run_config({**default_run_config(), "checkpoint-dir": "ckpt",
                                         **overrides})


def strategy(aggregation: str = "fedavg") -> ThresholdFedAvg:
    config = defaults(aggregation=aggregation)
    return ThresholdFedAvg(GLOBAL_TAU, ArrayRecord({"w": torch.zeros(SIZE)}), config.limits,
                           config.threshold_rule, config.aggregation, min_train_nodes=1,
                           min_available_nodes=1)






def honest() -> list[Message]:
    """Four devices with small updates and evidence that favours the global threshold."""
    return [reply(i, around(GLOBAL_TAU, 100, i), 100 + 10 * i, torch.full((SIZE,), 0.01 * i))
            for i in range(1, 5)]


def test_a_device_that_failed_is_counted_with_its_error_not_dropped_unsaid(tmp_path: Path
                                                                            ) -> None:
    """Flower hands the server a failed ClientApp's exception whole: the round names the
    device and the exception's last line, and its history row counts it (`fl simulate`
    once showed rounds in which every device had failed as if they had trained)."""
    from meancache.fl_server.rounds import RoundRecorder

    failed = Message(Error(0, "Traceback (most recent call last):\n  ...\n"
                              "RunConfigError: run config 'epochs' must be >= 1, not 0\n"),
                     reply_to=message(RecordDict(), dst=5))
    fedavg = strategy()
    fedavg.aggregate_train(1, [*honest(), failed])
    assert fedavg.screened[1].failed == {
        5: "RunConfigError: run config 'epochs' must be >= 1, not 0"}
    assert len(fedavg.screened[1].kept) == 4
    row = RoundRecorder(fedavg, tmp_path, "tiny", 1)(1, fedavg.global_arrays)
    assert row["failed"] == 1 and row["rejected"] == 0


def duplicates_at(similarity: float, pairs: int) -> dict[str, list[int]]:
    """A liar's evidence: ``pairs`` duplicates, all at ``similarity``."""
    return Evidence.of_pairs(np.full(pairs, similarity), np.ones(pairs)).to_metrics()


@pytest.mark.parametrize("aggregation", ["fedavg", "median"])
def test_one_device_claiming_huge_counts_barely_moves_the_threshold(aggregation: str) -> None:
    clean, attacked = strategy(aggregation), strategy(aggregation)
    clean_arrays, _ = clean.aggregate_train(1, honest())
    attacker = reply(9, duplicates_at(0.5, 10**6), 10**12, torch.full((SIZE,), 1000.0))
    attacked_arrays, _ = attacked.aggregate_train(1, [*honest(), attacker])
    assert abs(attacked.threshold - clean.threshold) <= 0.02
    assert attacked.threshold >= GLOBAL_TAU - defaults().threshold_rule.max_step
    moved = attacked_arrays.to_torch_state_dict()["w"]  # type: ignore[union-attr]
    assert float(moved.norm()) <= defaults().limits.max_update_norm + 1e-6
    screened = attacked.screened[1]
    assert screened.clipped_updates == 1 and screened.clamped_evidence == 1
    assert screened.evidence[-1].pairs == 100  # the round's median
    assert clean_arrays is not None


EVIDENCE = duplicates_at(0.5, 100)


@pytest.mark.parametrize("bad", [
    reply(9, {**EVIDENCE, DUPLICATES: [float("nan")] * BINS}, 100, torch.zeros(SIZE)),
    reply(9, EVIDENCE, 1e-6, torch.zeros(SIZE)),
    reply(9, {**EVIDENCE, DUPLICATES: [-5] * BINS}, 100, torch.zeros(SIZE)),
    reply(9, {**EVIDENCE, DUPLICATES: [1] * (BINS + 1)}, 100, torch.zeros(SIZE)),
    reply(9, {}, 100, torch.zeros(SIZE)),
    reply(9, EVIDENCE, 100, torch.full((SIZE,), float("nan"))),
    reply(9, EVIDENCE, float("inf"), torch.zeros(SIZE)),
    reply(9, EVIDENCE, 100, torch.zeros(SIZE + 1)),
], ids=["nan-evidence", "fractional-count", "negative-evidence", "long-evidence",
        "no-evidence", "nan-weights", "infinite-count", "other-shape"])
def test_a_malformed_reply_is_rejected_and_the_round_completes(bad: Message) -> None:
    clean, attacked = strategy(), strategy()
    expected, _ = clean.aggregate_train(1, honest())
    arrays, metrics = attacked.aggregate_train(1, [*honest(), bad])
    assert arrays is not None and metrics is not None
    assert set(attacked.screened[1].rejected) == {9}
    assert torch.allclose(arrays.to_torch_state_dict()["w"],
                          expected.to_torch_state_dict()["w"])  # type: ignore[union-attr]
    assert attacked.threshold == pytest.approx(clean.threshold)


def test_counts_and_evidence_are_clamped_to_the_median() -> None:
    run = strategy()
    replies = [reply(1, around(0.78, 100, 1), 100, torch.zeros(SIZE)),
               reply(2, around(0.79, 100, 2), 100, torch.zeros(SIZE)),
               reply(3, around(0.9, 900, 3), 900, torch.zeros(SIZE))]
    run.aggregate_train(1, replies)
    screened = run.screened[1]
    assert [e.pairs for e in screened.evidence][:2] == [100, 100]
    assert screened.evidence[2].pairs == 100  # 900 pairs count as 100
    assert _metrics_of(screened.kept[2])["num-examples"] == 100 and screened.clamped_evidence == 1


def _metrics_of(sent: Message) -> MetricRecord:
    return next(iter(sent.content.metric_records.values()))


def test_the_poisoning_bounds_are_validated() -> None:
    with pytest.raises(ValueError, match="'threshold-min-pairs' must be >= 1"):
        defaults(**{"threshold-min-pairs": 0})
    with pytest.raises(ValueError, match="'max-update-norm' must be > 0"):
        defaults(**{"max-update-norm": 0.0})
    with pytest.raises(ValueError, match="'aggregation' must be one of"):
        defaults(aggregation="mean")


# the device's side ------------------------------------------------------------------------
def test_a_device_refuses_a_global_model_it_cannot_use(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    context = device_context(tmp_path, tiny_dir)
    bad_threshold = train_message(tiny, 1, threshold=float("nan"))
    with pytest.raises(ValueError, match="threshold must lie strictly between"):
        client_app(bad_threshold, context)
    poisoned = train_message(tiny, 1)
    state = poisoned.content["arrays"].to_torch_state_dict()
    first = next(iter(state))
    state[first] = torch.full_like(state[first], float("nan"))
    poisoned.content["arrays"] = ArrayRecord(state)
    with pytest.raises(ValueError, match="non-finite values"):
        client_app(poisoned, context)
    assert not (tmp_path / "fl" / "global").exists()  # nothing was kept


def test_a_device_whose_training_diverged_sends_none_of_it(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK)
    context = device_context(tmp_path, tiny_dir)
    context.run_config["learning-rate"] = 1e30  # the weights overflow to inf and NaN
    sent = train_message(tiny, 1)
    answer = client_app(sent, context)
    metrics = answer.content["metrics"]
    assert metrics["num-examples"] == 0 and metrics["skipped"] == 1
    echoed = weights_sent(answer, sent)
    original = sent.content["arrays"].to_torch_state_dict()
    assert all(np.array_equal(echoed[k], original[k].numpy()) for k in original)
