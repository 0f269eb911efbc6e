"""A global model received in a Flower round is kept by the rule `fl sync` installs one
by (client.fl.trust, shared.fl.freshness): the server's signed description of it must
verify under the key the device trusts and be fresh (no older round than the one it has
or has seen, no expired signature, the weights it names), unless the user allows a
downgrade; and the server sends that description with round numbers that continue
across runs (fl_server.round_model)."""

import json
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import ArrayRecord, ConfigRecord, Message
from meancache.client.cache.store import EntryStore
from meancache.client.fl.client_app import app as client_app
from meancache.client.fl.trust import SEEN_KIND
from meancache.client.learning.bound import Bound, labels_needed
from meancache.client.learning.state import Learned
from meancache.fl_server.pooled_threshold import ThresholdRule
from meancache.fl_server.round_model import RoundModels
from meancache.fl_server.screening import ReplyLimits
from meancache.fl_server.strategy import ThresholdFedAvg
from meancache.shared.fl.bound_evidence import BINS, BoundEvidence
from meancache.shared.fl.checkpoint import (
    DESCRIPTION_KEY,
    GlobalModel,
    latest_checkpoint,
    read_meta,
    save_checkpoint,
    state_sha256,
)
from meancache.shared.fl.freshness import read_seen
from meancache.shared.fl.signing import LIFETIME_SECONDS, sign, verify
from sentence_transformers import SentenceTransformer

from tests.support.fl import ROUND_KEY, device_context, train_message, trust_round_key

PRIOR = 0.556  # the verifier's own threshold, as the bound's prior
JUDGE = "verifier-a"  # the verifier the device runs (its card.judge)


@pytest.fixture
def device(tmp_path: Path, tiny_dir: Path, monkeypatch: pytest.MonkeyPatch
           ) -> "Device":
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    return Device(tmp_path, tiny_dir)


class Device:
    """A device with no labelled pairs (it sits every round out, quickly) that is sent
    rounds through the real ClientApp."""

    def __init__(self, data_dir: Path, tiny_dir: Path) -> None:
        self.data_dir, self.tiny_dir = data_dir, tiny_dir

    def receive(self, sent: Message) -> None:
        reply = client_app(sent, device_context(self.data_dir, self.tiny_dir))
        assert not reply.has_error(), reply.error if reply.has_error() else ""
        assert reply.content["metrics"]["skipped"] == 1

    def kept(self) -> tuple[int, float] | None:
        """(round, global tau) of the model it keeps, or None."""
        latest = latest_checkpoint(self.data_dir / "fl" / "global")
        if latest is None:
            return None
        store = EntryStore(self.data_dir / "cache")
        try:
            return read_meta(latest).round, float(store.get_meta("threshold.global"))
        finally:
            store.close()


def redescribed(sent: Message, **changes: object) -> Message:
    """``sent`` with its description re-signed by ROUND_KEY after ``changes`` (``now``:
    when it was signed)."""
    now = changes.pop("now", None)
    config = sent.content["config"]
    meta = GlobalModel(**json.loads(str(config[DESCRIPTION_KEY]))) if changes or now else None
    if meta is not None:
        fields = meta.to_json() | changes
        config[DESCRIPTION_KEY] = json.dumps(sign(GlobalModel(**fields), ROUND_KEY,
                                                  now=now).to_json())
    return sent


def test_a_device_keeps_no_round_older_than_it_has_unless_allowed(
        device: Device, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch) -> None:
    trust_round_key(monkeypatch)
    device.receive(train_message(tiny, 1, threshold=0.9, model_round=5))
    assert device.kept() == (5, pytest.approx(0.9))
    # A genuinely signed earlier round (a replay): refused, tau untouched.
    device.receive(train_message(tiny, 1, threshold=0.5, model_round=2))
    assert device.kept() == (5, pytest.approx(0.9))
    seen = read_seen(device.data_dir / "fl", SEEN_KIND)  # the record `fl sync` reads too
    assert seen is not None and seen.round == 5
    device.receive(train_message(tiny, 1, threshold=0.8, model_round=6))
    assert device.kept() == (6, pytest.approx(0.8))
    monkeypatch.setenv("MEANCACHE_ALLOW_DOWNGRADE", "1")  # the user's explicit choice
    device.receive(train_message(tiny, 1, threshold=0.5, model_round=2))
    assert device.kept() == (2, pytest.approx(0.5))


def test_a_device_keeps_only_a_fresh_description_signed_by_its_key_of_those_weights(
        device: Device, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch) -> None:
    sent = train_message(tiny, 1, threshold=0.7, model_round=3)
    device.receive(sent)  # no key trusted (nor fl_allow_unsigned): nothing kept
    assert device.kept() is None
    trust_round_key(monkeypatch)
    stranger = Ed25519PrivateKey.generate()
    old = time.time() - LIFETIME_SECONDS - 60
    other = {name: value + 1 for name, value in
             sent.content["arrays"].to_torch_state_dict().items()}
    refused = [
        train_message(tiny, 1, model_round=3, key=stranger),  # another server's key
        redescribed(train_message(tiny, 1, model_round=3), now=old),  # expired
        redescribed(train_message(tiny, 1, model_round=3), sha256=state_sha256(other)),
        redescribed(train_message(tiny, 1, model_round=3), threshold=0.1),  # tau not signed
    ]
    forged = refused[-1].content["config"]
    forged[DESCRIPTION_KEY] = forged[DESCRIPTION_KEY].replace('"threshold": 0.1',
                                                              '"threshold": 0.2')
    bare = train_message(tiny, 1, model_round=3)
    del bare.content["config"][DESCRIPTION_KEY]  # an older server's message
    for message in (*refused, bare):
        device.receive(message)
        assert device.kept() is None
    device.receive(sent)
    assert device.kept() == (3, pytest.approx(0.7))
    # The same round signed earlier than the one seen, with other content: replaced.
    earlier = redescribed(train_message(tiny, 1, threshold=0.4, model_round=3),
                          now=time.time() - 3600)
    device.receive(earlier)
    assert device.kept() == (3, pytest.approx(0.7))


def test_the_server_describes_what_it_sends_in_its_continued_numbering(
        tmp_path: Path) -> None:
    state = {"w": torch.arange(4, dtype=torch.float32)}
    strategy = ThresholdFedAvg(0.8, ArrayRecord(state), ReplyLimits(10, 1.0),
                               ThresholdRule(1, 1, 0.1),
                               models=RoundModels(ROUND_KEY, "base", 1, round_offset=7,
                                                  verifier_base="ab" * 32))
    config = ConfigRecord({})
    strategy._describe(config, 2, ArrayRecord(state))
    meta = GlobalModel(**json.loads(str(config[DESCRIPTION_KEY])))
    verify(meta, ROUND_KEY.public_key())
    assert (meta.round, meta.threshold, meta.verifier_base) == (9, 0.8, "ab" * 32)
    assert time.time() - 60 < meta.signed_at < meta.expires
    # The sha256 it names is the one of the checkpoint these weights make, on either side.
    saved = save_checkpoint(tmp_path, 9, ArrayRecord(state).to_torch_state_dict(), 0.8,
                            "base", 1)
    assert meta.sha256 == saved.sha256


def _pooled_right(labels: int, judge: str = JUDGE) -> BoundEvidence:
    """Other devices' error-bound labels, all right, scored 0.3 to 0.5 by ``judge``."""
    scores = np.linspace(0.3, 0.5, labels)
    return BoundEvidence.of_labels(scores, np.zeros(labels), np.ones(labels)).judged_by(judge)


def _device_bound(device: "Device") -> Bound:
    store = EntryStore(device.data_dir / "cache")
    try:
        return Learned(store, 0.02, PRIOR, judge=JUDGE).bound
    finally:
        store.close()


def test_a_new_device_serves_at_the_bound_the_pool_learned_only_when_it_is_signed(
        device: Device, tiny: SentenceTransformer, monkeypatch: pytest.MonkeyPatch) -> None:
    """A device without one label installs the error-bound evidence a signed round
    carries (what the server pooled from other devices) and answers from the threshold
    those labels support, below the verifier's own; the same evidence altered after
    signing, or signed but not evidence any labels make, is refused with the model."""
    trust_round_key(monkeypatch)
    pool = _pooled_right(400)
    assert _device_bound(device) == Bound(PRIOR, None, None, 0, False)
    tampered = train_message(tiny, 1, model_round=3, bound=pool)
    config = tampered.content["config"]
    description = json.loads(str(config[DESCRIPTION_KEY]))
    description["bound"]["bound-labels"][0] += 50  # more right labels than were pooled
    config[DESCRIPTION_KEY] = json.dumps(description)
    unsigned = train_message(tiny, 1, model_round=3, bound=pool)
    del unsigned.content["config"][DESCRIPTION_KEY]
    impossible = redescribed(train_message(tiny, 1, model_round=3), bound={
        "bins": [100], "bound-labels": [1], "bound-weight": [5000.0],
        "bound-weight-squared": [1.0], "bound-weight-wrong": [0.0]})  # w above 1000·count
    for message in (tampered, unsigned, impossible):
        device.receive(message)
        assert device.kept() is None
        assert _device_bound(device) == Bound(PRIOR, None, None, 0, False)
    device.receive(train_message(tiny, 1, model_round=3, bound=pool))
    assert device.kept() == (3, pytest.approx(0.8))
    bound = _device_bound(device)
    assert bound.learned and bound.pooled == bound.labels >= labels_needed(0.02)
    assert 0.3 - 1 / BINS <= bound.threshold < 0.5 < PRIOR
    # A signed pool of another verifier's scores comes with a model the device keeps,
    # but its bound, judged by its own verifier, does not rest on it.
    device.receive(train_message(tiny, 1, model_round=4, bound=_pooled_right(400, "other")))
    assert device.kept() == (4, pytest.approx(0.8))
    assert _device_bound(device) == Bound(PRIOR, None, None, 0, False)
