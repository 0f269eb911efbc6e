"""A device's part of a round: load the global model the server sent (and keep it when
its signed description is trusted), train the encoder (unless the run federates the
verifier alone) and the learned verifier's top layers and head
(shared.verifier.federated) on this device's pairs, or score the global model on
them; the reply carries both models' weights in one record (the verifier's under
``verifier.``), counts, and the similarity evidence of its validation pairs
(shared.fl.evidence) from which the server tunes the global threshold.

Imported by client.fl.client_app's handlers only when a message asks for training or
evaluation: it brings torch and sentence-transformers.
"""

import logging
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
from meancache.client.config import load_settings
from meancache.client.device_caches import Asked, Rescore
from meancache.client.fl.data import partition, split
from meancache.client.fl.device import DeviceState
from meancache.client.fl.rescore import rescorer
from meancache.client.fl.train import pair_similarities, train_locally
from meancache.client.matching.settings import RECALL_MARGIN
from meancache.client.verifier import export_global_verifier
from meancache.shared.encoder import load_sentence_transformer, locate_model
from meancache.shared.errors import MeanCacheError
from meancache.shared.fl.bound_evidence import (
    COSINE_KEYS,
    ROUND_COSINE_JUDGE,
    ROUND_JUDGE,
    BoundEvidence,
)
from meancache.shared.fl.checkpoint import DESCRIPTION_KEY, latest_checkpoint
from meancache.shared.fl.client_config import ClientConfig
from meancache.shared.fl.evidence import Evidence
from meancache.shared.fl.weights import (
    check_finite,
    federated_names,
    federated_state,
    load_federated_state,
    split_verifier,
    verifier_names,
    with_verifier,
)
from meancache.shared.pairs import Pair, read_pairs
from meancache.shared.query import embedding_text
from meancache.shared.threshold import check_threshold, score_thresholds
from meancache.shared.verifier.federated import (
    base_dir,
    base_sha,
    base_verifier,
    pair_probabilities,
    train_verifier,
)
from meancache.shared.verifier.model import CrossEncoder
from meancache.shared.verifier.runtime import read_card
from sentence_transformers import SentenceTransformer

log = logging.getLogger(__name__)


@cache
def _base_model(model: str | None, models_dir: Path, trained: bool) -> SentenceTransformer:
    """One base model per process (simulation reuses processes across clients); every
    message overwrites its federated weights before use. One that no round trains
    (``trained`` false: run config train-encoder = 0) is another: no message's weights
    would undo what a round that trains it did."""
    return load_sentence_transformer(locate_model(model, models_dir))


def _models_dir(node: dict[str, Any]) -> Path:
    """Where an assembled MPNet is kept: the device's data dir (the user's default one on
    a simulated node)."""
    data_dir = node.get("data-dir")
    return load_settings(data_dir=Path(str(data_dir)) if data_dir else None).models_dir


@cache
def _qqp(path: Path) -> list[Pair]:
    return read_pairs(path, split="train")


def labelled_pairs(config: ClientConfig, node: dict[str, Any]) -> list[Pair]:
    """This node's labelled pairs as asked (on a device: of the chat's cache and every
    proxy cache): the verifier reads them so, as the matcher hands it questions."""
    if config.qqp_path is not None and config.data_source == "qqp":
        return partition(_qqp(config.qqp_path), int(node["partition-id"]),
                         int(node["num-partitions"]), config.pairs_per_client,
                         config.partitioning, config.train.seed, config.cache_dir)
    return DeviceState(Path(str(node["data-dir"]))).pairs()


def learned_pairs(config: ClientConfig, node: dict[str, Any]) -> list[Pair]:
    """On a device, what its caches learned from the upstream's answers (labelled pairs
    for the verifier: client.device_caches); none in simulation."""
    if config.data_source == "qqp":
        return []
    return DeviceState(Path(str(node["data-dir"]))).learned_pairs()


def for_encoder(pairs: list[Pair]) -> list[Pair]:
    """Pairs normalised as the device's matcher embeds questions: the encoder's weights
    train, and the threshold evidence is measured, in the space tau acts in."""
    return [Pair(embedding_text(p.q1), embedding_text(p.q2), p.label) for p in pairs]


def local_pairs(config: ClientConfig, node: dict[str, Any]) -> list[Pair]:
    return for_encoder(labelled_pairs(config, node))


def bound_evidence(got: "Received", validation: list[Pair], similarities: np.ndarray
                   ) -> tuple[BoundEvidence, BoundEvidence]:
    """The error-bound evidence this node sends (shared.fl.bound_evidence), of the
    verifier's labels and of the cosine's: on a device, the labels every cache learned
    scored by each judge the round names (client.fl.device); in simulation, its
    validation pairs as labels (a pair whose questions differ is a wrong answer) scored
    by the global verifier it was sent, where the verifier is federated (else there is no
    verifier score to send), and by the global encoder's cosine (``similarities``)."""
    if got.config.data_source != "qqp":
        verifier, cosine = DeviceState(Path(str(got.node["data-dir"]))).bound_evidence(
            got.judge, got.cosine_judge)
        return verifier, cosine
    if not validation:
        return BoundEvidence.empty(), BoundEvidence.empty()
    wrong = np.array([p.label == 0 for p in validation], dtype=float)
    cosine = BoundEvidence.of_labels(similarities, wrong, np.ones(len(validation)))
    rescore = judge_rescorer(got, RECALL_MARGIN)
    if rescore is None:
        return BoundEvidence.empty(), cosine
    scores = rescore([Asked(p.q1, [p.q2], [float(c)]) for p, c in zip(
        validation, similarities, strict=True)])
    kept = ~np.isnan(scores)  # NaN: none here (a pair alone is its own pick)
    return BoundEvidence.of_labels(scores[kept], wrong[kept], np.ones(int(kept.sum()))), \
        cosine


def judge_rescorer(got: "Received", recall_margin: float) -> Rescore | None:
    """How the round's judge scores labels it did not make (client.fl.rescore): with the
    global verifier it sent, the global encoder's cosines where a label kept none, and
    the recall tau of its threshold; None without a federated verifier (no score to
    send) or for a judge this device cannot score."""
    verifier = got.verifier
    if verifier is None:
        return None
    return rescorer(got.judge, lambda pairs: pair_probabilities(verifier, pairs),
                    lambda pairs: pair_similarities(got.model, for_encoder(pairs)),
                    got.threshold - recall_margin,
                    read_card(base_dir(got.config.model.verifier_dir)).threshold)


def bound_metrics(got: "Received", bound: tuple[BoundEvidence, BoundEvidence]
                  ) -> dict[str, list[float]]:
    """Both sets of sums as a reply's metrics; the cosine's only where the round names
    its judge (an older server names none, and would not know the keys)."""
    verifier, cosine = bound
    return {**verifier.to_metrics(),
            **(cosine.to_metrics(COSINE_KEYS) if got.cosine_judge else {})}


def _reply(msg: Message, arrays: ArrayRecord, metrics: dict[str, float | list[int]]
           ) -> Message:
    return Message(RecordDict({"arrays": arrays, "metrics": MetricRecord(metrics)}),
                   reply_to=msg)


@dataclass(frozen=True)
class Received:
    config: ClientConfig
    node: dict[str, Any]
    model: SentenceTransformer  # with the global weights loaded
    verifier: CrossEncoder | None  # likewise; None where the verifier is not federated
    arrays: ArrayRecord
    threshold: float
    judge: str = ""  # whose labels the round pools (shared.fl.bound_evidence.ROUND_JUDGE)
    cosine_judge: str = ""  # ... and whose cosine labels (ROUND_COSINE_JUDGE)


def receive(msg: Message, config: ClientConfig, node: dict[str, Any], keep: bool = True
            ) -> Received:
    """Load the global weights; on a real device also keep them (and the threshold) when
    the server's signed description of them is trusted and fresh (DeviceState.keep_global:
    else the device still takes part, and keeps what it has), unless ``keep`` is false
    (the evidence round's). A non-finite weight or an invalid threshold is refused
    (ValueError) before anything is loaded or kept."""
    threshold = check_threshold(msg.content["config"]["threshold"])
    arrays = msg.content["arrays"]
    state = arrays.to_torch_state_dict()
    check_finite(state)
    encoder_state, verifier_state = split_verifier(state)
    model = _base_model(config.model.encoder_model, _models_dir(node),
                        config.model.train_encoder)
    load_federated_state(model, encoder_state)
    verifier, verifier_base = None, ""
    if config.model.verifier_layers > 0:
        verifier = base_verifier(config.model.verifier_dir)
        if set(verifier_state) != set(verifier_names(verifier, config.model.verifier_layers)):
            raise ValueError("the global model does not hold the verifier's top "
                             f"{config.model.verifier_layers} layers and head")
        load_federated_state(verifier, verifier_state)  # type: ignore[arg-type]
        verifier_base = base_sha(config.model.verifier_dir)
    if keep and "data-dir" in node:
        try:
            DeviceState(Path(str(node["data-dir"]))).keep_global(
                state, msg.content["config"].get(DESCRIPTION_KEY), verifier_base)
        except MeanCacheError as exc:
            log.warning("not keeping this round's global model: %s", exc)
    judges = [msg.content["config"].get(key, "") for key in (ROUND_JUDGE, ROUND_COSINE_JUDGE)]
    return Received(config, node, model, verifier, arrays, threshold,
                    *(judge if isinstance(judge, str) else "" for judge in judges))


def evidence_reply(msg: Message, got: Received) -> Message:
    """The evidence round's reply (fl_server.evidence_round): the error-bound evidence of
    the global model received, which nothing trains: on a device every cache's labels
    scored anew by its verifier (where federated: else the verifier the labels name
    stays) and its encoder's cosine; in simulation the validation pairs, as a training
    reply's."""
    if got.config.data_source == "qqp":
        pairs = labelled_pairs(got.config, got.node)
        held = split(pairs, seed=got.config.train.seed)[1] \
            if len(pairs) >= got.config.min_pairs else []
        bound = bound_evidence(got, held, pair_similarities(got.model, for_encoder(held)))
    else:
        device = DeviceState(Path(str(got.node["data-dir"])))
        verifier_sums, cosine_sums = device.rescored_evidence(
            (got.judge, judge_rescorer(got, device.settings.recall_margin)),
            (got.cosine_judge, lambda asked: pair_similarities(got.model, for_encoder(
                [Pair(a.question, a.stored[a.pick], 1) for a in asked]))))
        bound = verifier_sums, cosine_sums
    return Message(RecordDict({"metrics": MetricRecord(bound_metrics(got, bound))}),
                   reply_to=msg)


def train_reply(msg: Message, got: Received) -> Message:
    pairs = labelled_pairs(got.config, got.node)
    if len(pairs) < got.config.min_pairs:
        log.info("only %d labelled pairs (< %d): not training this round", len(pairs),
                 got.config.min_pairs)
        return _skipped(msg, got, bound_evidence(got, [], np.zeros(0)))
    asked, held = split(pairs, seed=got.config.train.seed)
    train_pairs, validation = for_encoder(asked), for_encoder(held)
    # The evidence is of the global model the server sent, not of this device's trained
    # one: a device's own training pulls its similarities away from the averaged model's
    # (pooled evidence of trained models put the best tau near 0.77 while the global
    # MPNet's stayed near 0.89).
    similarities = pair_similarities(got.model, validation)
    evidence = Evidence.of_pairs(similarities, np.array([p.label for p in validation]))
    bound = bound_evidence(got, held, similarities)  # of the global models, before training
    loss, trained = 0.0, {}  # the verifier alone is federated (run config train-encoder)
    if got.config.model.train_encoder:
        loss = train_locally(got.model, train_pairs, got.config.train)
        trained = federated_state(got.model, federated_names(got.model,
                                                             got.config.model.top_layers))
    metrics: dict[str, float | list[int]] = {
        "num-examples": len(train_pairs), "train-loss": loss, "skipped": 0,
        **evidence.to_metrics(), **bound_metrics(got, bound)}
    if got.verifier is not None:
        train = got.config.train
        judged = verifier_names(got.verifier, got.config.model.verifier_layers)
        metrics["verifier-train-loss"] = train_verifier(
            got.verifier, asked + learned_pairs(got.config, got.node), judged, train.epochs,
            train.batch_size, train.learning_rate, train.seed)
        trained = with_verifier(trained, federated_state(got.verifier, judged))  # type: ignore[arg-type]
    try:
        check_finite(trained)
    except ValueError as exc:  # training diverged: send nothing of it
        log.error("not sending this round's training: %s", exc)
        return _skipped(msg, got, bound)
    # in the order the round sent them (the server's, read from the model's files): Flower's
    # clipping mod pairs the reply's tensors with the sent ones by position
    trained = {name: trained[name] for name in got.arrays if name in trained} | trained
    return _reply(msg, ArrayRecord(trained), metrics)


def _skipped(msg: Message, got: Received, bound: tuple[BoundEvidence, BoundEvidence]
             ) -> Message:
    """Sitting the round's training out: the global weights back, no examples, no
    similarity evidence; the error-bound labels still count (they need no training)."""
    return _reply(msg, got.arrays, {"num-examples": 0, "train-loss": 0.0, "skipped": 1,
                                    **Evidence.empty().to_metrics(),
                                    **bound_metrics(got, bound)})


def evaluate_reply(msg: Message, got: Received) -> Message:
    _, validation = split(local_pairs(got.config, got.node), seed=got.config.train.seed)
    metrics: dict[str, float] = {"num-examples": len(validation)}
    if validation:
        sims = pair_similarities(got.model, validation)
        scores = score_thresholds(sims, np.array([p.label for p in validation]),
                                  np.array([got.threshold]))[0]
        metrics |= {"precision": scores.precision, "recall": scores.recall,
                    "f1": scores.f1, "f05": scores.f05}
    return Message(RecordDict({"metrics": MetricRecord(metrics)}), reply_to=msg)


def train(msg: Message, context: Context) -> Message:
    got = receive(msg, ClientConfig.from_run_config(context.run_config),
                  dict(context.node_config))
    return train_reply(msg, got)


def evidence(msg: Message, context: Context) -> Message:
    """Score this node's labels with the final global model's judges, keeping nothing."""
    got = receive(msg, ClientConfig.from_run_config(context.run_config),
                  dict(context.node_config), keep=False)
    return evidence_reply(msg, got)


def evaluate(msg: Message, context: Context) -> Message:
    """Keep the new global model on a device; score it on the local validation pairs."""
    got = receive(msg, ClientConfig.from_run_config(context.run_config),
                  dict(context.node_config))
    if got.verifier is not None and "data-dir" in got.node:  # the device's int8 verifier
        settings = DeviceState(Path(str(got.node["data-dir"]))).settings
        kept = latest_checkpoint(settings.global_model_dir)
        if kept is not None:
            try:
                export_global_verifier(settings, kept, got.config.model.verifier_dir)
            except MeanCacheError as exc:  # the device keeps the verifier it has
                log.warning("not making the global verifier: %s", exc)
    return evaluate_reply(msg, got)
