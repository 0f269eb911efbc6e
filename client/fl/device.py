"""What federated learning keeps on a device: the user's labelled pairs (from feedback),
the global models received, and which encoder the cache runs because of them."""

import logging
from pathlib import Path

import torch
from meancache.client.cache.store import EntryStore
from meancache.client.config import Settings, load_settings
from meancache.shared.encoder import Encoder, locate_model
from meancache.shared.encoder.fingerprint import model_fingerprint
from meancache.shared.errors import EncoderError
from meancache.shared.fl.checkpoint import latest_checkpoint, save_checkpoint
from meancache.shared.pairs import Pair

log = logging.getLogger(__name__)


class DeviceState:
    def __init__(self, settings: Settings | Path) -> None:
        self.settings = settings if isinstance(settings, Settings) else load_settings(
            data_dir=settings)

    def pairs(self) -> list[Pair]:
        """Rejected hits (negatives) and accepted hits (weak positives); exact repeats of a
        cached question teach nothing and are left out."""
        if not self.settings.cache_dir.exists():
            return []
        store = EntryStore(self.settings.cache_dir)
        try:
            return [Pair(p["query"], p["matched_query"], int(p["label"]))
                    for p in store.pairs()
                    if p["label"] == 0 or p["query"].strip().lower()
                    != p["matched_query"].strip().lower()]
        finally:
            store.close()

    def base_version(self, encoder_model: str | None) -> str:
        model_dir = locate_model(encoder_model)
        return model_fingerprint(model_dir, self.settings.encoder_dir / "fingerprints.json")

    def keep_global(self, state: dict[str, torch.Tensor], threshold: float, round_number: int,
                    encoder_model: str | None, top_layers: int) -> None:
        """Store a global model and threshold received from the server; the cache switches
        to it (and re-embeds) the next time it opens."""
        save_checkpoint(self.settings.global_model_dir, round_number, state, threshold,
                        self.base_version(encoder_model), top_layers)
        store = EntryStore(self.settings.cache_dir)
        try:
            store.set_meta("threshold.global", float(threshold))
        finally:
            store.close()
        log.info("kept global model of round %d (threshold %.4f)", round_number, threshold)

    def encoder(self) -> Encoder:
        """The encoder this device runs: the base model with the newest global weights."""
        settings = self.settings
        checkpoint = latest_checkpoint(settings.global_model_dir)
        kwargs = {"backend": settings.encoder_backend, "cache_dir": settings.encoder_dir}
        if checkpoint is not None:
            try:
                return Encoder.load(settings.encoder_model, global_weights=checkpoint,
                                    **kwargs)  # type: ignore[arg-type]
            except EncoderError as exc:
                log.warning("not using the global model in %s: %s", checkpoint, exc)
        return Encoder.load(settings.encoder_model, **kwargs)  # type: ignore[arg-type]
