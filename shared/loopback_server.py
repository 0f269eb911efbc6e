"""An ASGI app served by uvicorn on a daemon thread, on a loopback port: the chat's
embedded upstream and the servers tests start. The port is the one a socket bound here
got from the kernel and hands to uvicorn, so no other process can take it in between.
It keeps the limits of every server (meancache.shared.http_limits)."""

import socket
import threading
import time
from typing import Any

import uvicorn
from meancache.shared.http_limits import server_config


class LoopbackServer:
    def __init__(self, app: Any, name: str, **config: Any) -> None:
        self._socket = socket.socket()
        self._socket.bind(("127.0.0.1", 0))
        self.port = int(self._socket.getsockname()[1])
        self._server = uvicorn.Server(server_config(app, **config))
        self._thread = threading.Thread(target=self._server.run, name=name, daemon=True,
                                        kwargs={"sockets": [self._socket]})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 60.0) -> bool:
        """Start serving; False if it did not start within ``timeout`` seconds (the log
        says why)."""
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                return False
            time.sleep(0.02)
        return True

    def stop(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=10)
        self._socket.close()
