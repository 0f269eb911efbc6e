"""The encoder this device runs: the base model with the newest global weights that
federated learning kept (PCA is put back by the cache that fitted it). Chat, CLI, the
app's model switch and the FL client all load it here, so they agree on it."""

import logging

from meancache.client.config import Settings
from meancache.shared.encoder import Encoder, locate_model
from meancache.shared.errors import EncoderError
from meancache.shared.fl.checkpoint import latest_checkpoint

log = logging.getLogger(__name__)


def load_device_encoder(settings: Settings) -> Encoder:
    """The base model with the newest kept global weights; the base model alone when there
    are none or they do not fit it (trained from another base model, damaged). The first
    start of the mpnet profile assembles it (see ``assemble_encoder`` for a progress bar)."""
    model_dir = locate_model(settings.encoder_model, settings.models_dir)
    checkpoint = latest_checkpoint(settings.global_model_dir)
    if checkpoint is not None:
        try:
            return Encoder.load(model_dir, backend=settings.encoder_backend,
                                cache_dir=settings.encoder_dir, global_weights=checkpoint)
        except EncoderError as exc:
            log.warning("not using the global model in %s: %s", checkpoint, exc)
    return Encoder.load(model_dir, backend=settings.encoder_backend,
                        cache_dir=settings.encoder_dir)
