"""No configuration sends the embedding tables: the rows a device's training touched
would say which tokens its users typed."""

import math
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord
from flwr.common import (
    Code,
    FitRes,
    Status,
    ndarrays_to_parameters,
    parameters_to_ndarrays,
)
from flwr.server.strategy import FedAvg as LegacyFedAvg
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from meancache.client.fl.client_app import app as client_app
from meancache.fl_server.pooled_threshold import ThresholdRule
from meancache.fl_server.privacy import PrivacyLedger, SampledClientsDP, SecureSumDP
from meancache.fl_server.screening import ReplyLimits
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.fl.compression import compressed_bytes
from sentence_transformers import SentenceTransformer

from tests.support.fl import (
    FEEDBACK,
    around,
    device_context,
    device_with_feedback,
    gaussian_rdp_epsilon,
    reply,
    train_message,
    weights_sent,
)


@pytest.mark.parametrize("top_layers", [0, 1, 2, 3])  # the tiny encoder has 2 layers
def test_no_embedding_row_is_in_any_outgoing_message(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch, top_layers: int
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK)
    context = device_context(tmp_path, tiny_dir)
    context.run_config["top-layers"] = top_layers
    request = train_message(tiny, top_layers)
    reply = client_app(request, context)
    assert not reply.has_error() and reply.content["metrics"]["num-examples"] > 0
    wire = b"".join(o.deflate() for o in get_all_nested_objects(reply).values())
    sent = weights_sent(reply, request)
    # the trained layers did go out (as an 8-bit update: values and scales)
    assert len(wire) > compressed_bytes({n: v.shape for n, v in sent.items()}, 8)
    assert not [name for name in reply.content["arrays"] if ".embeddings." in name]
    tokens = tiny.tokenizer(" ".join(q for q, _, _ in FEEDBACK))["input_ids"]
    table = dict(tiny.named_parameters())["0.model.embeddings.word_embeddings.weight"]
    for token in set(tokens):
        assert table[token].detach().numpy().tobytes() not in wire


# central differential privacy -------------------------------------------------------------
def test_with_dp_every_device_counts_once_and_the_noise_fits_those_averaged() -> None:
    limits = ReplyLimits(max_examples=10**6, max_update_norm=1e6)
    strategy = ThresholdFedAvg(0.8, ArrayRecord({"w": torch.zeros(3)}), limits,
                               ThresholdRule(500, 50, 0.05), unweighted=True,
                               min_train_nodes=1, min_available_nodes=1)
    dp = SampledClientsDP(strategy, noise_multiplier=1e-9, clipping_norm=1.0, delta=1e-5)
    replies = [reply(1, around(0.8, 40, 1), 100, torch.full((3,), 1.0)),
               reply(2, around(0.7, 40, 2), 10, torch.full((3,), 4.0)),
               reply(3, around(0.75, 40, 3), 50, torch.full((3,), float("nan")))]  # rejected
    arrays, _ = dp.aggregate_train(1, replies)
    assert arrays is not None
    assert torch.allclose(arrays.to_torch_state_dict()["w"], torch.full((3,), 2.5))
    assert strategy.pooled[1].pairs == 80  # the rejected device's evidence is not pooled
    assert dp.num_sampled_clients == 2  # the noise is for the two averaged, not three
    assert dp.ledger.releases == 1


def test_under_secure_aggregation_the_noise_fits_the_devices_in_the_sum() -> None:
    """SecAgg+ hands the strategy the unmasked mean; a device that sat the round out
    (weight 0) is not in it, so the noise is for the others."""
    def fit(examples: int) -> tuple[None, FitRes]:
        mean = ndarrays_to_parameters([np.full(3, 2.0, dtype=np.float32)])
        return None, FitRes(Status(Code.OK, ""), mean, examples, {})

    dp = SecureSumDP(LegacyFedAvg(), noise_multiplier=1e-9, clipping_norm=1.0, delta=1e-5)
    parameters, _ = dp.aggregate_fit(1, [fit(1), fit(1), fit(0)], [])  # type: ignore[list-item]
    assert parameters is not None
    assert np.allclose(parameters_to_ndarrays(parameters)[0], 2.0, atol=1e-6)
    assert dp.num_sampled_clients == 2 and dp.ledger.releases == 1


@pytest.mark.parametrize(("sigma", "rounds"), [(1.1, 1), (1.1, 3), (0.7, 10)])
def test_the_reported_epsilon_matches_an_independent_computation(sigma: float, rounds: int
                                                                 ) -> None:
    ledger = PrivacyLedger(sigma, delta=1e-5)
    assert ledger.spent()["epsilon"] == 0.0
    for _ in range(rounds):
        ledger.release()
    spent = ledger.spent()
    assert spent["epsilon"] == pytest.approx(gaussian_rdp_epsilon(sigma, rounds, 1e-5))
    assert spent["delta"] == 1e-5 and spent["dp_releases"] == rounds
    # It is an upper bound of the exact epsilon of the composed Gaussian mechanism
    # (sigma / sqrt(rounds) for one release): its delta at the reported epsilon is <= 1e-5.
    s = sigma / math.sqrt(rounds)
    eps = spent["epsilon"]
    exact_delta = (NormalDist().cdf(1 / (2 * s) - eps * s)
                   - math.exp(eps) * NormalDist().cdf(-1 / (2 * s) - eps * s))
    assert exact_delta <= 1e-5
