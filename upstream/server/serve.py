"""Running the API: in the foreground (`meancache upstream serve`) or on a background
thread on loopback (the chat app's embedded upstream, and the tests)."""

import dataclasses
import logging
import os
import secrets
import sys
import time
from pathlib import Path

from meancache.shared.hosts import LOOPBACK_NAMES, is_loopback, open_server_warning
from meancache.shared.http_limits import listening_socket, serve_foreground
from meancache.shared.loopback_server import LoopbackServer
from meancache.shared.processes import exit_on_sigterm
from meancache.shared.progress import Progress
from meancache.shared.running_upstream import BACKGROUND, RunningUpstream, register, unregister
from meancache.upstream.errors import NoPackError, UpstreamError
from meancache.upstream.model_loading import LoadedModel, load_model
from meancache.upstream.precision import DEFAULT_KV_FORMAT, DEFAULT_PRECISION
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.server.app import ServerSettings, create_app
from meancache.upstream.server.packs import latest_pack
from starlette.types import ASGIApp, Receive, Scope, Send

log = logging.getLogger(__name__)


def describe(loaded: LoadedModel) -> str:
    kind = "an untrained random-init demo model" if loaded.untrained else loaded.architecture
    return (f"{loaded.name} ({kind}, {loaded.parameters / 1e6:.1f}M parameters, "
            f"{loaded.precision})")


def describe_packs(settings: ServerSettings) -> str:
    """What the start line says about instruction packs ("" when none are published)."""
    if settings.packs_dir is None:
        return ""
    try:
        path, manifest = latest_pack(settings.packs_dir)
    except NoPackError:
        return f", and no instruction pack yet (none in {settings.packs_dir})"
    return (f", and instruction pack {manifest.pack_id} ({manifest.count} instructions, "
            f"{path.name})")


def report_conversion(done: int, total: int) -> None:
    """Progress of builtin:gemma-3-270m's one-time conversion (minutes on a small CPU)."""
    print(f"meancache upstream: preparing the model, {100 * done // max(total, 1)}%",
          file=sys.stderr, flush=True)


def serve(model: str, host: str, port: int, settings: ServerSettings,
          module_budget_bytes: int, data_dir: Path | None = None,
          precision: str = DEFAULT_PRECISION, prefix_reuse: bool = True,
          kv_format: str = DEFAULT_KV_FORMAT) -> None:
    listener = listening_socket(host, port)  # a port in use is said before the model loads
    warning = open_server_warning(host, bool(settings.api_key or settings.api_keys))
    if warning:  # a host it can listen on: it prints
        log.warning(warning)
        print(f"meancache upstream: {warning}", file=sys.stderr, flush=True)
    if is_loopback(host) and settings.allowed_hosts is None:
        settings = dataclasses.replace(settings, allowed_hosts=LOOPBACK_NAMES)
    loaded = load_model(model, data_dir=data_dir, progress=report_conversion,
                        precision=precision)
    engine = PromptCacheEngine(loaded, module_budget_bytes, prefix_reuse, kv_format=kv_format)
    app = create_app(engine, settings)
    line = f"serving {describe(loaded)} on http://{host}:{port}{describe_packs(settings)}"
    log.info(line)
    print(f"meancache upstream: {line}", file=sys.stderr, flush=True)
    serve_foreground(app, listener)


class Activity:
    """ASGI wrapper that knows how long the app has had no request under way (a streamed
    answer counts until its last byte), so that a background server can exit when idle."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.running = 0
        self.last = time.monotonic()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        self.running += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.running -= 1
            self.last = time.monotonic()

    def idle_seconds(self) -> float:
        return 0.0 if self.running else time.monotonic() - self.last


class BackgroundServer:
    """The upstream on a daemon thread, on a free loopback port, until ``stop``. It answers
    only to loopback names (see meancache.shared.hosts)."""

    def __init__(self, model: str = "builtin:tiny", settings: ServerSettings | None = None,
                 module_budget_bytes: int = 512 << 20, data_dir: Path | None = None,
                 progress: Progress | None = None, precision: str = "float32",
                 prefix_reuse: bool = True, kv_format: str = DEFAULT_KV_FORMAT) -> None:
        self.settings = dataclasses.replace(settings or ServerSettings(),
                                            allowed_hosts=LOOPBACK_NAMES)
        self.loaded = load_model(model, data_dir=data_dir, progress=progress,
                                 precision=precision)
        engine = PromptCacheEngine(self.loaded, module_budget_bytes, prefix_reuse,
                                   kv_format=kv_format)
        self.activity = Activity(create_app(engine, self.settings))
        self._server = LoopbackServer(self.activity, "upstream")
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
        log.info("embedded upstream %s at %s", describe(self.loaded), self.url)
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


def serve_until_idle(model: str, data_dir: Path, idle_exit_s: float,
                     poll_s: float = 1.0) -> None:
    """`meancache upstream background`: the embedded upstream in its own process, with a
    private key, registered in ``data_dir`` (shared.running_upstream) for `meancache ask`
    to reuse, until it has been idle ``idle_exit_s`` seconds or is stopped (SIGTERM, as
    `meancache upstream stop` sends). It unregisters itself on the way out."""
    exit_on_sigterm()
    server = BackgroundServer(model, private_settings(), data_dir=data_dir,
                              progress=report_conversion, precision=DEFAULT_PRECISION).start()
    pid = os.getpid()
    register(data_dir, RunningUpstream(server.url, server.api_key, model, pid, BACKGROUND,
                                       idle_exit_s))
    print(f"meancache upstream: serving {describe(server.loaded)} on {server.url} in the "
          f"background (pid {pid}); it exits after {idle_exit_s:.0f} s idle, or on "
          "`meancache upstream stop`", file=sys.stderr, flush=True)
    try:
        while server.activity.idle_seconds() < idle_exit_s:
            time.sleep(poll_s)
        log.info("idle for %.0f s: the background upstream exits", idle_exit_s)
    finally:
        unregister(data_dir, pid)
        server.stop()
