"""A chat request is one turn on the model thread (issue 26, item 2): another key's request
waits for at most the greedy key's request running now, not for a second one slipped in
between its prompt's preparation and its generation. The real server on loopback."""

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
from meancache.shared.loopback_server import LoopbackServer
from meancache.upstream.model_loading import load_model
from meancache.upstream.prompt_cache.engine import PromptCacheEngine
from meancache.upstream.server.app import ServerSettings, create_app
from meancache.upstream.server.tenants import tenant_id
from meancache.upstream.server.worker import ModelWorker

GREEDY, OTHER = "key-of-greedy", "key-of-other"


def wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 60
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def test_another_keys_chat_waits_for_one_greedy_request_at_most() -> None:
    engine = PromptCacheEngine(load_model("builtin:tiny"), 64 << 20)
    app = create_app(engine, ServerSettings(api_key=GREEDY, api_keys=(OTHER,)))
    worker: ModelWorker = app.state.worker
    turns: list[str] = []  # the tenant of every job the model thread picks, in order
    pick = worker._next

    def recorded() -> Any:
        picked = pick()
        if picked is not None:
            turns.append(picked[0])
        return picked

    worker._next = recorded  # type: ignore[method-assign]
    server = LoopbackServer(app, "upstream")
    assert server.start()
    hold, held = threading.Event(), threading.Event()
    try:
        gate = threading.Thread(target=lambda: asyncio.run(worker.call(
            lambda: (held.set(), hold.wait(60)), "gate")))
        gate.start()
        assert held.wait(60)
        answers: list[int] = []

        def ask(key: str) -> None:
            with httpx.Client(base_url=server.url, timeout=120,
                              headers={"Authorization": f"Bearer {key}"}) as client:
                answers.append(client.post("/v1/chat/completions", json={
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
                }).status_code)

        threads = [threading.Thread(target=ask, args=(GREEDY,)) for _ in range(4)]
        for thread in threads:
            thread.start()
        wait_until(lambda: worker.queued_for(tenant_id(GREEDY)) == 4, "greedy queued")
        threads.append(threading.Thread(target=ask, args=(OTHER,)))
        threads[-1].start()
        wait_until(lambda: worker.queued_for(tenant_id(OTHER)) == 1, "other queued")
        hold.set()
        for thread in [gate, *threads]:
            thread.join(60)
        assert answers == [200] * 5
        other = [i for i, tenant in enumerate(turns) if tenant == tenant_id(OTHER)]
        greedy_before = turns[:other[-1]].count(tenant_id(GREEDY))
        assert greedy_before <= 1, turns  # only the one that was first in line
    finally:
        server.stop()
