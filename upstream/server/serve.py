"""`meancache upstream serve`: load the model and run the API with uvicorn."""

import logging
import sys

import uvicorn

from upstream.model_loading import load_model
from upstream.prompt_cache.engine import PromptCacheEngine
from upstream.server.app import ServerSettings, create_app

log = logging.getLogger(__name__)


def serve(model: str, host: str, port: int, settings: ServerSettings,
          module_budget_bytes: int) -> None:
    loaded = load_model(model)
    engine = PromptCacheEngine(loaded, module_budget_bytes)
    app = create_app(engine, settings)
    kind = "an untrained random-init demo model" if loaded.untrained else loaded.architecture
    log.info("serving %s on http://%s:%d", loaded.name, host, port)
    print(f"meancache upstream: serving {loaded.name} ({kind}, "
          f"{loaded.parameters / 1e6:.1f}M parameters) on http://{host}:{port}",
          file=sys.stderr, flush=True)
    uvicorn.run(app, host=host, port=port, log_config=None, access_log=False)
