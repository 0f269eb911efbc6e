"""Starting `meancache proxy`: the upstream (the configured one, checked; or the embedded
one), the device's encoder and instruction pack, then the API on loopback, in the
foreground (``serve``) or on a thread (``Proxy.start``: the tests and the benchmark)."""

import logging
from dataclasses import dataclass

import uvicorn
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
from meancache.shared.http_limits import server_config
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

    def serve(self, host: str, port: int) -> None:
        """In the foreground until Ctrl+C (or SIGTERM: shared.processes.exit_on_sigterm);
        then the app's lifespan and ``close`` close every cache."""
        try:
            uvicorn.Server(server_config(self.app, host=host, port=port)).run()
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


def listen_warning(host: str) -> str | None:
    if is_loopback(host):
        return None
    return (f"serving on {host}: anyone who can reach it may use your upstream and read "
            "what the apps' keys cached; set proxy_apps to admit only their keys")
