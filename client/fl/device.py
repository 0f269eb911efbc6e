"""What federated learning keeps on a device: the global models received. The labelled
pairs come from the cache's feedback (client.cache.feedback), the threshold goes through
client.cache.threshold, and the encoder those models make is loaded by
client.encoder.load_device_encoder."""

import logging
from pathlib import Path

import torch
from meancache.client.cache.threshold import set_global_threshold
from meancache.client.config import Settings, load_settings
from meancache.shared.encoder import locate_model
from meancache.shared.encoder.fingerprint import model_fingerprint
from meancache.shared.fl.checkpoint import prune_rounds, save_checkpoint

log = logging.getLogger(__name__)

KEEP_ROUNDS = 3  # global models kept on a device (the newest; older ones are deleted)


class DeviceState:
    def __init__(self, settings: Settings | Path) -> None:
        self.settings = settings if isinstance(settings, Settings) else load_settings(
            data_dir=settings)

    def base_version(self, encoder_model: str | None) -> str:
        model_dir = locate_model(encoder_model, self.settings.models_dir)
        return model_fingerprint(model_dir, self.settings.encoder_dir / "fingerprints.json")

    def keep_global(self, state: dict[str, torch.Tensor], threshold: float, round_number: int,
                    encoder_model: str | None, top_layers: int) -> None:
        """Store a global model and threshold received from the server; the cache switches
        to it (and re-embeds) the next time it opens."""
        save_checkpoint(self.settings.global_model_dir, round_number, state, threshold,
                        self.base_version(encoder_model), top_layers)
        prune_rounds(self.settings.global_model_dir, KEEP_ROUNDS)
        set_global_threshold(self.settings.cache_dir, threshold)
        log.info("kept global model of round %d (threshold %.4f)", round_number, threshold)
