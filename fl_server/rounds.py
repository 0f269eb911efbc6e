"""After every round: checkpoint the global model (versioned, with its threshold, the
pooled error-bound evidence of both judges and a sha256, signed by the server's key:
shared.fl.signing), append a line to history.jsonl, and optionally score it on held-out
pairs."""

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import numpy as np
from flwr.app import ArrayRecord, MetricRecord
from meancache.fl_server.pooled_threshold import Pooled
from meancache.fl_server.screening import Screened
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.fl.checkpoint import save_checkpoint
from meancache.shared.fl.signing import server_key, sign
from meancache.shared.fl.weights import load_federated_state, split_verifier
from meancache.shared.threshold import best_threshold, score_thresholds

if TYPE_CHECKING:  # the type only: the pipeline is built only for held-out scoring
    from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)

HISTORY = "history.jsonl"  # one JSON line of metrics per round (`fl simulate` follows it)


@dataclass
class HeldOut:
    """Labelled pairs the server scores each global model on (simulation only: a real
    server holds no user data)."""

    model: "SentenceTransformer"
    q1: list[str]
    q2: list[str]
    labels: np.ndarray

    def score(self, arrays: ArrayRecord, threshold: float) -> dict[str, float]:
        load_federated_state(self.model, split_verifier(arrays.to_torch_state_dict())[0])
        a = self.model.encode(self.q1, normalize_embeddings=True, batch_size=64)
        b = self.model.encode(self.q2, normalize_embeddings=True, batch_size=64)
        sims = (a * b).sum(1)
        at = score_thresholds(sims, self.labels, np.array([threshold]))[0]
        best = best_threshold(sims, self.labels)
        return {"f05": at.f05, "f1": at.f1, "precision": at.precision, "recall": at.recall,
                "best_threshold": best.threshold, "best_f05": best.f05, "best_f1": best.f1,
                "best_precision": best.precision, "best_recall": best.recall}


class RoundStats(Protocol):
    """What a round's strategy recorded (fl_server.strategy.ThresholdFedAvg, or
    fl_server.secure_rounds.SecureFedAvg under SecAgg+)."""

    threshold: float
    bound: BoundEvidence
    cosine_bound: BoundEvidence
    bytes_received: dict[int, dict[int, int]]
    verifier_bytes: dict[int, dict[int, int]]
    screened: dict[int, Screened]
    pooled: dict[int, Pooled]


@dataclass
class RoundRecorder:
    """Used as FedAvg's ``evaluate_fn``: called with the final (post-DP) global weights
    at round 0 and after every round."""

    strategy: RoundStats
    checkpoint_dir: Path
    base_model: str
    top_layers: int
    round_offset: int = 0  # rounds of an earlier run this one continues from
    held_out: HeldOut | None = None
    privacy: Callable[[], dict[str, float]] | None = None  # epsilon so far, with DP on
    verifier_base: str = ""  # sha256 of the int8 verifier trained from ("": not federated)
    started: float = field(default_factory=time.time)

    def __call__(self, server_round: int, arrays: ArrayRecord) -> MetricRecord:
        metrics: dict[str, float] = {"round": server_round + self.round_offset,
                                     "threshold": self.strategy.threshold,
                                     "bound_labels": self.strategy.bound.labels,
                                     "cosine_bound_labels": self.strategy.cosine_bound.labels,
                                     "seconds": time.time() - self.started}
        received = self.strategy.bytes_received.get(server_round, {})
        if received:
            metrics["bytes_per_client"] = sum(received.values()) / len(received)
            metrics["clients"] = len(received)
            verifier = self.strategy.verifier_bytes.get(server_round, {})
            metrics["verifier_bytes_per_client"] = sum(verifier.values()) / len(received)
        screened = self.strategy.screened.get(server_round)
        if screened is not None:
            metrics |= {"rejected": len(screened.rejected), "failed": len(screened.failed),
                        "clipped_updates": screened.clipped_updates,
                        "clamped_evidence": screened.clamped_evidence}
        pooled = self.strategy.pooled.get(server_round)
        if pooled is not None:
            metrics |= {"evidence_pairs": pooled.pairs,
                        "candidate_threshold": pooled.candidate}
        if self.privacy is not None:
            metrics |= self.privacy()
        if self.held_out is not None:
            metrics |= self.held_out.score(arrays, self.strategy.threshold)
        if server_round > 0:
            state = arrays.to_torch_state_dict()
            save_checkpoint(self.checkpoint_dir, server_round + self.round_offset, state,
                            self.strategy.threshold, self.base_model, self.top_layers,
                            metrics, partial(sign, key=server_key(self.checkpoint_dir)),
                            self.verifier_base, self.strategy.bound.to_record(),
                            self.strategy.cosine_bound.to_record())
        self.checkpoint_dir.mkdir(parents=True, exist_ok=True)
        with (self.checkpoint_dir / HISTORY).open("a") as fh:
            fh.write(json.dumps(metrics) + "\n")
        log.info("round %d: %s", server_round, metrics)
        self.started = time.time()
        return MetricRecord(metrics)
