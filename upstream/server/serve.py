"""Running the API: in the foreground (`meancache upstream serve`) or on a background
thread on loopback (the chat app's embedded upstream, and the tests)."""

import dataclasses
import logging
import secrets
import sys
from pathlib import Path

import uvicorn
from meancache.shared.hosts import LOOPBACK_NAMES, is_loopback, open_server_warning
from meancache.shared.http_limits import server_config
from meancache.shared.loopback_server import LoopbackServer
from meancache.shared.progress import Progress
from meancache.upstream.errors import UpstreamError
from meancache.upstream.model_loading import LoadedModel, load_model
from meancache.upstream.precision import DEFAULT_PRECISION
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.server.app import ServerSettings, create_app

log = logging.getLogger(__name__)


def describe(loaded: LoadedModel) -> str:
    kind = "an untrained random-init demo model" if loaded.untrained else loaded.architecture
    return f"{loaded.name} ({kind}, {loaded.parameters / 1e6:.1f}M parameters)"


def report_conversion(done: int, total: int) -> None:
    """Progress of builtin:gemma-3-270m's one-time conversion (minutes on a small CPU)."""
    print(f"meancache upstream: preparing the model, step {done}/{total}",
          file=sys.stderr, flush=True)


def serve(model: str, host: str, port: int, settings: ServerSettings,
          module_budget_bytes: int, data_dir: Path | None = None,
          precision: str = DEFAULT_PRECISION) -> None:
    warning = open_server_warning(host, bool(settings.api_key or settings.api_keys))
    if warning:
        log.warning(warning)
        print(f"meancache upstream: {warning}", file=sys.stderr, flush=True)
    if is_loopback(host) and settings.allowed_hosts is None:
        settings = dataclasses.replace(settings, allowed_hosts=LOOPBACK_NAMES)
    loaded = load_model(model, data_dir=data_dir, progress=report_conversion,
                        precision=precision)
    app = create_app(PromptCacheEngine(loaded, module_budget_bytes), settings)
    log.info("serving %s on http://%s:%d", loaded.name, host, port)
    print(f"meancache upstream: serving {describe(loaded)} on http://{host}:{port}",
          file=sys.stderr, flush=True)
    uvicorn.Server(server_config(app, host=host, port=port)).run()


class BackgroundServer:
    """The upstream on a daemon thread, on a free loopback port, until ``stop``. It answers
    only to loopback names (see meancache.shared.hosts)."""

    def __init__(self, model: str = "builtin:tiny", settings: ServerSettings | None = None,
                 module_budget_bytes: int = 512 << 20, data_dir: Path | None = None,
                 progress: Progress | None = None, precision: str = "float32") -> None:
        self.settings = dataclasses.replace(settings or ServerSettings(),
                                            allowed_hosts=LOOPBACK_NAMES)
        self.loaded = load_model(model, data_dir=data_dir, progress=progress,
                                 precision=precision)
        app = create_app(PromptCacheEngine(self.loaded, module_budget_bytes), self.settings)
        self._server = LoopbackServer(app, "upstream")
        self.port = self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    @property
    def api_key(self) -> str | None:
        return self.settings.api_key

    @property
    def label(self) -> str:
        kind = "untrained demo model" if self.loaded.untrained else "local model"
        return f"{self.loaded.name} ({kind})"

    def start(self, timeout: float = 60.0) -> "BackgroundServer":
        if not self._server.start(timeout):
            raise UpstreamError(f"the embedded upstream server did not start within "
                                f"{timeout:.0f}s (its log says why); pass --upstream URL "
                                "to use a running server instead")
        log.info("embedded upstream %s at %s", self.loaded.name, self.url)
        return self

    def stop(self) -> None:
        self._server.stop()

    def __enter__(self) -> "BackgroundServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def private_settings() -> ServerSettings:
    """Settings of a server only its starter may use: a random key made for this run (a
    process on the machine, or a page in its browser, cannot guess it)."""
    return ServerSettings(api_key=secrets.token_urlsafe(32))
