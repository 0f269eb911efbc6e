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
"""

import logging
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.client.cache.threshold import set_global_threshold
from meancache.client.config import Settings, load_settings
from meancache.client.device_caches import device_alias_pairs, device_cache_dirs, device_pairs
from meancache.shared.encoder import locate_model
from meancache.shared.encoder.fingerprint import model_fingerprint
from meancache.shared.fl.checkpoint import prune_rounds, save_checkpoint
from meancache.shared.pairs import Pair

if TYPE_CHECKING:  # weights are handed over, never computed here
    import torch

log = logging.getLogger(__name__)

KEEP_ROUNDS = 3  # global models kept on a device (the newest; older ones are deleted)


class DeviceState:
    def __init__(self, settings: Settings | Path) -> None:
        self.settings = settings if isinstance(settings, Settings) else load_settings(
            data_dir=settings)

    def base_version(self, encoder_model: str | None) -> str:
        model_dir = locate_model(encoder_model, self.settings.models_dir)
        return model_fingerprint(model_dir, self.settings.encoder_dir / "fingerprints.json")

    def keep_global(self, state: "dict[str, torch.Tensor]", threshold: float, round_number: int,
                    encoder_model: str | None, top_layers: int, verifier_base: str = ""
                    ) -> None:
        """Store a global model and threshold received from the server; the cache switches
        to it (and re-embeds) the next time it opens. ``verifier_base``: the sha256 of the
        int8 verifier its ``verifier.`` tensors were trained from ("": none)."""
        save_checkpoint(self.settings.global_model_dir, round_number, state, threshold,
                        self.base_version(encoder_model), top_layers,
                        verifier_base=verifier_base)
        prune_rounds(self.settings.global_model_dir, KEEP_ROUNDS)
        self.set_global_threshold(threshold)
        log.info("kept global model of round %d (threshold %.4f)", round_number, threshold)

    def set_global_threshold(self, value: float) -> None:
        """The FL server's tau for every cache on the device (the chat's first: made if
        it does not exist yet, so that the chat starts from it)."""
        for _, cache_dir in device_cache_dirs(self.settings):
            set_global_threshold(cache_dir, value)

    def pairs(self) -> list[Pair]:
        """The labelled pairs of every cache on the device, for training and threshold
        evidence; they leave the device only as weight updates and evidence counts."""
        return device_pairs(directory for _, directory in device_cache_dirs(self.settings))

    def alias_pairs(self) -> list[Pair]:
        """The aliases every cache on the device learned, as positive pairs: the
        verifier trains on them beside ``pairs``; they too leave the device only as
        weight updates."""
        return device_alias_pairs(directory for _, directory in device_cache_dirs(
            self.settings))
