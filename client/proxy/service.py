"""Starting `meancache proxy`: the upstream (the configured one, checked; or the embedded
one), the device's encoder and instruction pack, then the API on loopback, in the
foreground (``serve``) or on a thread (``Proxy.start``: the tests and the benchmark)."""

import logging
import socket
from dataclasses import dataclass

import httpx
from meancache.client.chat.session import EmbeddedUpstream, UpstreamStarter
from meancache.client.config import Settings
from meancache.client.encoder import load_device_encoder
from meancache.client.errors import ConfigError
from meancache.client.pack import PackStore
from meancache.client.proxy.app import ProxyState, create_app
from meancache.client.proxy.apps import Apps
from meancache.client.proxy.partitions import Partitions
from meancache.client.upstream_client import UpstreamClient
from meancache.shared.hosts import LOOPBACK_NAMES, is_loopback
from meancache.shared.http_limits import serve_foreground
from meancache.shared.loopback_server import LoopbackServer
from starlette.applications import Starlette

log = logging.getLogger(__name__)


@dataclass
class Proxy:
    app: Starlette
    state: ProxyState
    embedded: EmbeddedUpstream | None
    _server: LoopbackServer | None = None

    @classmethod
    def open(cls, settings: Settings, start_upstream: UpstreamStarter | None = None,
             loopback: bool = True) -> "Proxy":
        """Check the upstream (or start the embedded one) and load the encoder: blocking,
        seconds. ``loopback``: answer only requests that name a loopback host."""
        apps = Apps(settings.proxy_apps, settings.proxy_shared)
        if (keyless := apps.keyless_warning()) is not None:
            log.warning(keyless)
        embedded = None
        if settings.upstream_url:
            upstream = UpstreamClient(settings.upstream_url, settings.upstream_api_key,
                                      settings.upstream_model)
        elif start_upstream is not None:
            embedded = start_upstream(settings.embedded_model, settings.data_dir, None)
            upstream = UpstreamClient(embedded.url, embedded.api_key)
        else:
            raise ConfigError("no upstream_url is configured: set it, or pass --upstream URL")
        try:
            model = upstream.check()
            encoder = load_device_encoder(settings)
        except BaseException:
            if embedded is not None:
                embedded.stop()
            raise
        partitions = Partitions(settings, encoder, upstream, PackStore(settings.packs_dir))
        state = ProxyState(apps, partitions, upstream, model, settings.answer_max_tokens,
                           settings.proxy_greedy_only, LOOPBACK_NAMES if loopback else None)
        return cls(create_app(state), state, embedded)

    def serve(self, listener: socket.socket) -> None:
        """On ``listener`` (shared.http_limits.listening_socket) in the foreground until
        Ctrl+C (or SIGTERM: shared.processes.exit_on_sigterm); then the app's lifespan and
        ``close`` close every cache."""
        try:
            serve_foreground(self.app, listener)
        finally:
            self.close()

    def start(self) -> str:
        """On a free loopback port, on a thread; returns the base URL (with /v1)."""
        self._server = LoopbackServer(self.app, "proxy")
        if not self._server.start():
            raise ConfigError("the proxy did not start (its log says why)")
        return f"{self._server.url}/v1"

    def close(self) -> None:
        if self._server is not None:
            self._server.stop()  # the app's lifespan closes the caches and the client
            self._server = None
        else:
            self.state.partitions.close()
        if self.embedded is not None:
            self.embedded.stop()


def own_address_problem(upstream_url: str | None, host: str, port: int) -> str | None:
    """Why ``upstream_url`` cannot be the proxy's upstream because it is the proxy itself
    (each request would be relayed to itself until its deadline), or None. The usual way
    in: OPENAI_BASE_URL set in the shell for the apps, then read by the proxy too."""
    if not upstream_url:
        return None
    url = httpx.URL(upstream_url if "://" in upstream_url else f"http://{upstream_url}")
    target = url.port or (443 if url.scheme == "https" else 80)
    listening = {host.strip("[]").lower()}
    if is_loopback(host) or host in {"0.0.0.0", "::", "[::]"}:
        listening |= {name.strip("[]") for name in LOOPBACK_NAMES}
    if target != port or url.host.lower() not in listening:
        return None
    return (f"the upstream {upstream_url} is this proxy's own address; give the real one "
            "with --upstream (or unset OPENAI_BASE_URL in the proxy's shell: it is the "
            "apps' setting)")


def listen_warning(host: str) -> str | None:
    if is_loopback(host):
        return None
    return (f"serving on {host}: anyone who can reach it may use your upstream and read "
            "what the apps' keys cached; set proxy_apps to admit only their keys")
