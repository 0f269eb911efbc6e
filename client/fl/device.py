"""What federated learning keeps on a device: the global models received and the global
tau. The labelled pairs come from the feedback of every cache on the device (the chat's
and each proxy cache's, client/device_caches.py), read through client.matching.labels; the
threshold goes through client.cache.threshold, and the encoder those models make is
loaded by client.encoder.load_device_encoder.

The device's global tau (the FL server's newest) has one source of truth: the chat
cache's store (``threshold.global``). ``DeviceState.set_global_threshold``, its only
writer, copies it into every proxy cache in the same call (open ones see it at their
next lookup: tau is read from the store); a proxy cache made later copies it when it is
made (client/proxy/partitions.py). Each cache's local tau stays its own.

The error-bound labels travel the same way in both directions: every cache's go out
with a training reply as sums per score bin (``bound_evidence``: shared.fl.bound_evidence,
only those scored by the judges the round names, the verifier and the embedding's cosine,
a set of sums each, marked sent in each cache by client.learning.state), and the pools a
verified global model carries, each naming its judge, are installed in every cache with
its threshold (``set_pooled_bound``); a cache applies the one naming the judge it runs
(the verifier, or with it off the cosine of its vector space), an open one from its next
lookup on.
"""

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.client.cache.threshold import set_global_threshold
from meancache.client.config import Settings, load_settings
from meancache.client.device_caches import (
    Rescore,
    device_bound_evidence,
    device_cache_dirs,
    device_learned_pairs,
    device_pairs,
    device_rescored_evidence,
    set_device_pooled,
)
from meancache.client.fl.trust import accept_fresh, installed_round, trusted_key
from meancache.shared.errors import CheckpointError
from meancache.shared.fl.bound_evidence import BoundEvidence
from meancache.shared.fl.checkpoint import (
    GlobalModel,
    prune_rounds,
    save_checkpoint,
    state_sha256,
)
from meancache.shared.fl.signing import verify
from meancache.shared.pairs import Pair
from meancache.shared.threshold import check_threshold

if TYPE_CHECKING:  # weights are handed over, never computed here
    import torch

log = logging.getLogger(__name__)

KEEP_ROUNDS = 3  # global models kept on a device (the newest; older ones are deleted)


class DeviceState:
    def __init__(self, settings: Settings | Path) -> None:
        self.settings = settings if isinstance(settings, Settings) else load_settings(
            data_dir=settings)

    def keep_global(self, state: "dict[str, torch.Tensor]", description: str | None,
                    verifier_base: str = "") -> None:
        """Keep a global model received in a Flower round, by the same rule as `fl sync`
        (client.fl.trust): ``description`` (the server's signed JSON of its round,
        threshold and weights' sha256; None from a server that sends none) must verify
        under the FL server's key and be fresh, and ``state`` must be what it describes.
        The global threshold is set from it, and the cache switches to the model (and
        re-embeds) the next time it opens. ``verifier_base``: the sha256 of the int8
        verifier this device trains the ``verifier.`` tensors over ("": the verifier is not
        federated); the description must name the same (client.verifier applies global
        verifier weights only over their base). MeanCacheError: nothing kept or changed."""
        meta = _described(description)
        key = trusted_key(self.settings)
        root = self.settings.global_model_dir
        if key is not None:
            verify(meta, key)
        if meta.verifier_base != verifier_base:
            raise CheckpointError(f"{meta.label} holds a verifier trained from the int8 "
                                  f"verifier {meta.verifier_base[:16] or 'none'}, not this "
                                  f"device's ({verifier_base[:16] or 'none'}); not kept")
        if state_sha256(state) != meta.sha256:
            raise CheckpointError(f"the weights sent with {meta.label} are not the ones its "
                                  "description names (sha256); not kept")
        if key is None:
            log.warning("keeping %s unverified (fl_allow_unsigned)", meta.label)
        else:
            accept_fresh(meta, installed_round(root), self.settings)
        save_checkpoint(root, meta.round, state, meta.threshold, meta.base_model,
                        meta.top_layers, meta.metrics, sign=lambda _: meta)
        prune_rounds(root, KEEP_ROUNDS)
        self.set_global_threshold(meta.threshold)
        self.set_pooled_bound(meta.bound, meta.cosine_bound)
        log.info("kept global model of round %d (threshold %.4f)", meta.round, meta.threshold)

    def set_global_threshold(self, value: float) -> None:
        """The FL server's tau for every cache on the device (the chat's first: made if
        it does not exist yet, so that the chat starts from it)."""
        for _, cache_dir in device_cache_dirs(self.settings):
            set_global_threshold(cache_dir, value)

    def set_pooled_bound(self, *records: dict) -> None:
        """The bound evidence a verified global model carries (the verifier's pool and the
        cosine's, checked when its description was parsed: ``pooled_bound``), for every
        cache on the device."""
        set_device_pooled((d for _, d in device_cache_dirs(self.settings)),
                          *(pooled_bound(record) for record in records))

    def bound_evidence(self, *judges: str) -> list[BoundEvidence]:
        """The error-bound labels of every cache on the device scored by each of
        ``judges`` (the round's: a pool holds one judge's scores), as the evidence a
        training reply carries; they are marked sent (client.learning.state)."""
        return device_bound_evidence((d for _, d in device_cache_dirs(self.settings)),
                                     judges)

    def rescored_evidence(self, *judges: tuple[str, Rescore | None]) -> list[BoundEvidence]:
        """As ``bound_evidence``, each judge with a ``Rescore`` scoring every cache's
        labels anew (federated learning's evidence round: the final global model's
        judges, which scored none of them yet)."""
        return device_rescored_evidence((d for _, d in device_cache_dirs(self.settings)),
                                        judges)

    def pairs(self) -> list[Pair]:
        """The labelled pairs of every cache on the device, for training and threshold
        evidence; they leave the device only as weight updates and evidence counts."""
        return device_pairs(directory for _, directory in device_cache_dirs(self.settings))

    def learned_pairs(self) -> list[Pair]:
        """What every cache on the device learned from the upstream's answers (labels
        with their questions, aliases) as pairs: the verifier trains on them beside
        ``pairs``; they too leave the device only as weight updates."""
        return device_learned_pairs(directory for _, directory in device_cache_dirs(
            self.settings))


def _described(description: str | None) -> GlobalModel:
    """The server's description of a round's global model, parsed; CheckpointError for
    none or a malformed one."""
    if not isinstance(description, str):
        raise CheckpointError("the FL server sent no signed description of this round's "
                              "global model (an older server?); not kept")
    try:
        meta = GlobalModel(**json.loads(description))
        check_threshold(meta.threshold)
        pooled_bound(meta.bound)
        pooled_bound(meta.cosine_bound)
        if not isinstance(meta.round, int) or isinstance(meta.round, bool) or meta.round < 0:
            raise ValueError(f"round {meta.round!r}")
    except (ValueError, TypeError) as exc:
        raise CheckpointError(f"the FL server's description of this round's global model "
                              f"is invalid ({exc}); not kept") from None
    return meta


def pooled_bound(record: object) -> BoundEvidence:
    """The pooled bound evidence of a global model's description; CheckpointError naming
    what is wrong with a malformed one (the whole model is then refused)."""
    try:
        return BoundEvidence.from_record(record)
    except ValueError as exc:
        raise CheckpointError(f"the FL server's pooled bound evidence is invalid ({exc}); "
                              "not kept") from None
