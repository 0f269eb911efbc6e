"""Federated learning in tests: devices with feedback, messages as a SuperNode gets
them, replies as the server screens them, and global models as the server publishes them."""

import json
import os
import signal
import subprocess
import time
from contextlib import suppress
from functools import partial
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, Metadata, MetricRecord, RecordDict
from meancache.client.cache.store import EntryStore
from meancache.client.cache.threshold import ThresholdState
from meancache.client.config import Settings, load_settings
from meancache.client.device_caches import proxy_dir
from meancache.fl_server.app_declaration import default_run_config
from meancache.fl_server.round_model import RoundModels
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.fl.checkpoint import (
    DESCRIPTION_KEY,
    META,
    WEIGHTS,
    GlobalModel,
    latest_checkpoint,
    round_dir,
    save_checkpoint,
)
from meancache.shared.fl.compression import (
    compressed_bytes,
    decode_update,
    encoded_names,
    is_compressed,
)
from meancache.shared.fl.evidence import Evidence
from meancache.shared.fl.signing import public_key_text, server_key, sign
from meancache.shared.fl.weights import federated_names, federated_state
from sentence_transformers import SentenceTransformer
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse, Response
from starlette.routing import Route


def message(content: RecordDict, kind: str = "train", dst: int = 7) -> Message:
    return Message(content=content, metadata=Metadata(
        run_id=1, message_id=f"m{dst}", src_node_id=0, dst_node_id=dst, reply_to_message_id="",
        group_id="1", created_at=time.time(), ttl=3600, message_type=kind))


def device_with_feedback(data_dir: Path, questions: list[tuple[str, str, int]],
                         cache: str | None = None) -> None:
    """Labelled pairs in the chat's cache, or in the proxy cache ``cache``
    (NAMESPACE/PARTITION under the proxy's directory)."""
    settings = load_settings(config_dir=data_dir / "cfg", data_dir=data_dir, environ={},
                             encoder_model="minilm")
    store = EntryStore(proxy_dir(settings) / cache / "cache" if cache else settings.cache_dir)
    for i, (q1, q2, label) in enumerate(questions):
        store.put_pair(f"p{i}", {"query": q1, "matched_query": q2, "similarity": 0.9,
                                 "label": label, "weak": label == 1, "entry_id": "e",
                                 "time": float(i)})
    store.close()


FEEDBACK = [
    (f"how do I cook rice number {i}", f"best way to cook rice {i}", 1) for i in range(12)
] + [(f"what is the capital of country {i}", f"what is the currency of country {i}", 0)
     for i in range(12)]


def device_context(data_dir: Path, tiny_dir: Path,
                   verifier: dict[str, int | str] | None = None) -> Context:
    """A SuperNode's context: the app's run config (with a run's overrides) and the
    user's data dir; ``verifier``: its run-config keys (by default not federated)."""
    run_config = {**default_run_config(), "encoder-model": str(tiny_dir), "top-layers": 1,
                  "min-pairs": 10, **(verifier or {"verifier-top-layers": 0})}
    return Context(run_id=1, node_id=7, node_config={"data-dir": str(data_dir)},
                   state=RecordDict(), run_config=run_config)


# The FL server's signing key in messages made here; a device trusts it with
# trust_round_key.
ROUND_KEY = Ed25519PrivateKey.generate()


def trust_round_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a device (its settings read from the environment) trust ROUND_KEY."""
    monkeypatch.setenv("MEANCACHE_FL_SERVER_PUBLIC_KEY",
                       public_key_text(ROUND_KEY.public_key()))


def train_message(tiny: SentenceTransformer, top_layers: int, threshold: float = 0.8,
                  model_round: int = 2, key: Ed25519PrivateKey = ROUND_KEY,
                  bound: BoundEvidence | None = None) -> Message:
    """Round 3's training message: the global model after round ``model_round``, with the
    server's description of it signed by ``key`` (fl_server.round_model)."""
    arrays = ArrayRecord(federated_state(tiny, federated_names(tiny, top_layers)))
    return round_message(arrays, threshold, model_round, top_layers, key=key, bound=bound)


def round_message(arrays: ArrayRecord, threshold: float, model_round: int, top_layers: int = 1,
                  verifier_base: str = "", key: Ed25519PrivateKey = ROUND_KEY,
                  kind: str = "train", bound: BoundEvidence | None = None) -> Message:
    """A round's message carrying ``arrays`` as the global model after ``model_round``
    (and the pooled error-bound evidence ``bound``), described and signed as the server
    does (fl_server.round_model)."""
    description = RoundModels(key, "base", top_layers, 0, verifier_base).describe(
        model_round, threshold, arrays, bound)
    return message(RecordDict({"arrays": arrays, "config": ConfigRecord(
        {"threshold": threshold, DESCRIPTION_KEY: description})}), kind=kind)


def weights_sent(reply: Message, request: Message, rank: int | None = None
                 ) -> dict[str, np.ndarray]:
    """The weights a device's training reply stands for: its quantised update (of factors
    of at most ``rank``; None: the app's default update-rank) decoded onto the weights it
    was sent (shared.fl.compression), or its float weights."""
    arrays = {name: a.numpy() for name, a in reply.content["arrays"].items()}
    if not is_compressed(arrays):
        return arrays
    return decode_update(arrays, {name: a.numpy()
                                  for name, a in request.content["arrays"].items()},
                         int(default_run_config()["update-rank"]) if rank is None else rank)


NPY_HEADER = 128  # bytes np.save writes before a 1-D array's data (format version 1)


def wire_bound(shapes: dict[str, tuple[int, ...]], bits: int, rank: int = 0) -> int:
    """Bytes of a compressed reply of tensors of these shapes (of rank-``rank`` factors
    where that factors them), as the server counts them: values and scales, and each
    array's npy header and name."""
    framing = sum(NPY_HEADER + len(array) for name, shape in shapes.items()
                  for array in encoded_names(name, shape, rank))
    return compressed_bytes(shapes, bits, rank) + framing


def around(tau: float, pairs: int, seed: int) -> dict[str, list[int]]:
    """Validation evidence whose duplicates lie above ``tau`` and distinct pairs below."""
    rng = np.random.default_rng(seed)
    labels = rng.random(pairs) < 0.4
    sims = np.where(labels, rng.normal(tau + 0.05, 0.03, pairs), rng.normal(tau - 0.05, 0.03,
                                                                           pairs))
    return Evidence.of_pairs(sims, labels).to_metrics()


def reply(node: int, evidence: dict[str, object], examples: float,
          weights: torch.Tensor | ArrayRecord) -> Message:
    """A device's training reply; ``weights``: the one tensor "w", or a whole record."""
    return Message(RecordDict({
        "arrays": weights if isinstance(weights, ArrayRecord) else ArrayRecord({"w": weights}),
        "metrics": MetricRecord({"num-examples": examples, "train-loss": 0.1, "skipped": 0,
                                 **evidence})}),
        reply_to=message(RecordDict({"config": ConfigRecord({})}), dst=node))


def publish(root: Path, round_number: int, threshold: float, seed: int | None = None
            ) -> GlobalModel:
    """A checkpoint as the FL server writes one after a round, signed with its key."""
    generator = torch.Generator().manual_seed(round_number if seed is None else seed)
    state = {"w": torch.randn(4, 4, generator=generator), "b": torch.randn(4, generator=generator)}
    return save_checkpoint(root, round_number, state, threshold, base_model="base",
                           top_layers=0, metrics={"f1": 0.5 + round_number / 100},
                           sign=partial(sign, key=server_key(root)))


def impostor_endpoint(root: Path) -> Starlette:
    """What anyone answering in the model endpoint's place can serve (the real one serves
    only checkpoints its key verifies): the checkpoints under ``root`` as they lie on
    disk, their meta.json sent as it is, verified by nobody."""
    async def describe(request: Request) -> Response:
        latest = latest_checkpoint(root)
        if latest is None:
            return JSONResponse({"error": {"message": "none"}}, status_code=404)
        meta = json.loads((latest / META).read_text())
        return JSONResponse(meta | {"weights_url": f"/v1/global-model/rounds/{meta['round']}"
                                                   "/weights"})

    async def weights(request: Request) -> Response:
        return FileResponse(round_dir(root, request.path_params["round"]) / WEIGHTS)

    return Starlette(routes=[Route("/v1/global-model", describe),
                             Route("/v1/global-model/rounds/{round:int}/weights", weights)])


def cache_threshold(settings: Settings) -> float:
    store = EntryStore(settings.cache_dir)
    try:
        return ThresholdState(store).global_value
    finally:
        store.close()


def gaussian_rdp_epsilon(sigma: float, rounds: int, delta: float) -> float:
    """Epsilon of ``rounds`` Gaussian releases without subsampling, computed by hand: the
    RDP of one release at order a is a / (2 sigma^2), rounds add up, and the conversion
    to (epsilon, delta) is Balle et al. 2020's, minimised over the orders 1.1 .. 63."""
    orders = np.concatenate([np.linspace(1.1, 10.9, 99), np.arange(12, 64)])
    rdp = rounds * orders / (2 * sigma**2)
    eps = rdp - (np.log(delta) + np.log(orders)) / (orders - 1) + np.log((orders - 1) / orders)
    return float(eps.min())


def children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (read from /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def running(pid: int) -> bool:
    """Whether ``pid`` is a live process (not gone, not a zombie awaiting its reaper)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``, children before their children."""
    found, frontier = [], [pid]
    while frontier:
        frontier = [child for parent in frontier for child in children(parent)]
        found += frontier
    return found


def kill_group(process: "subprocess.Popen[bytes]") -> None:
    """Kill a process started with ``start_new_session=True``, everything in its group and
    every process below it that left the group: a SuperLink starts its SuperExec in a
    session of its own (flwr's detach), and that one the ServerApps, which a kill of the
    group alone would leave running. Fails the teardown if one outlives the kill."""
    tree = descendants(process.pid)
    with suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    for pid in tree:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    process.wait(timeout=30)
    deadline = time.monotonic() + 30
    while alive := [pid for pid in tree if running(pid)]:
        assert time.monotonic() < deadline, f"processes {alive} outlived the kill"
        time.sleep(0.1)
