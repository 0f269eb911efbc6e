"""A real upstream server on loopback for tests: uvicorn in a thread, stopped afterwards."""

import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from upstream.model_loading import load_model
from upstream.prompt_cache.engine import PromptCacheEngine
from upstream.server.app import ServerSettings, create_app


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def running_upstream(model: str = "builtin:tiny",
                     settings: ServerSettings | None = None) -> Iterator[str]:
    """Yields the base URL of a server running ``model`` until the block ends."""
    engine = PromptCacheEngine(load_model(model, device="cpu"))
    app = create_app(engine, settings)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None,
                                           access_log=False))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the upstream server did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=10)
