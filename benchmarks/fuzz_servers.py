"""A standing fuzz target per server: the test suites' hypothesis strategies (valid and
broken chat requests, PML markup, gateway paths; tests/support/fuzz.py), drawn by the
thousand against each server run as a user runs it, each in its own process on loopback:

- upstream: `meancache upstream serve --model builtin:tiny` (answers of at most 4 tokens);
- proxy: `meancache proxy` in front of that upstream;
- FL gateway and model endpoint: `meancache fl server` (a real SuperLink behind the Fleet
  gateway: the Fleet paths with any bytes as their body, and paths around them; the
  endpoint serving one signed global model).

Per server: the cases sent, the answers by status class, 5xx, transport errors, the
tracebacks its logs (and its stdout/stderr) gained during the run, and its resident
memory (VmRSS of the serving process) after a warm-up and at the end. Each run draws new
cases from a seed it prints; `--seed N` replays a run.

    python benchmarks/fuzz_servers.py               # 1,000 cases per server
    python benchmarks/fuzz_servers.py --quick       # 50
    python benchmarks/fuzz_servers.py --servers proxy upstream
"""

import http.client
import json
import os
import secrets
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from _common import (
    REPO_ROOT,
    apply_defaults,
    base_parser,
    heading,
    machine_load,
    make_table,
    note,
    print_command,
    print_table,
)
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from meancache.fl_server.fleet_gateway import FLEET_METHODS

sys.path.insert(0, str(REPO_ROOT))  # the test suites' strategies
from tests.support.fuzz import (  # noqa: E402
    JSON,
    MARKUP,
    RAW_PATHS,
    chat_bodies,
    chat_requests,
)

SERVERS = ["upstream", "proxy", "gateway", "endpoint"]
MODEL = "builtin:tiny"
ANSWER_TOKENS = 4
WARM_UP = 20  # cases sent before the first memory reading (lazy loads, first caches)


@dataclass(frozen=True)
class Case:
    method: str
    path: str
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)


JSON_HEADERS = {"Content-Type": "application/json", "Authorization": "Bearer fuzz"}


def chat(body: bytes) -> Case:
    return Case("POST", "/v1/chat/completions", body, JSON_HEADERS)


def encoded(value: Any) -> bytes:
    return json.dumps(value).encode()


HEADER_TEXT = st.text(st.characters(min_codepoint=32, max_codepoint=126), max_size=40)
METHODS = st.sampled_from(["GET", "POST", "PUT", "DELETE", "HEAD", "OPTIONS", "PATCH"])
API_PATHS = st.lists(st.sampled_from(
    ["v1", "chat", "completions", "models", "schemas", "meancache", "feedback", "metrics",
     "health", "packs", "openapi.json", "..", ".", "", "%2e%2e", "%2f", "x"]),
    min_size=1, max_size=4).map(lambda parts: "/" + "/".join(parts))
ANY_REQUEST = st.builds(Case, METHODS, API_PATHS, st.binary(max_size=80),
                        st.just(JSON_HEADERS))

STRATEGIES: dict[str, st.SearchStrategy[Case]] = {
    "upstream": st.one_of(
        chat_requests(MODEL, ANSWER_TOKENS).map(encoded).map(chat),
        chat_bodies(MODEL).map(chat),
        JSON.map(lambda v: Case("POST", "/v1/schemas", encoded(v), JSON_HEADERS)),
        MARKUP.map(lambda m: Case("POST", "/v1/schemas", m.encode("utf-8", "replace"),
                                  {"Content-Type": "application/pml+xml"})),
        ANY_REQUEST),
    "proxy": st.one_of(
        chat_requests(MODEL, 8).map(encoded).map(chat),
        chat_bodies(MODEL).map(chat),
        JSON.map(lambda v: Case("POST", "/v1/meancache/feedback", encoded(v), JSON_HEADERS)),
        ANY_REQUEST),
    "gateway": st.builds(Case, st.sampled_from(["POST", "POST", "GET", "PUT"]),
                         RAW_PATHS | st.sampled_from(sorted(FLEET_METHODS.values())),
                         st.binary(max_size=200),
                         st.just({"Content-Type": "application/protobuf"})),
    "endpoint": st.builds(
        Case, st.sampled_from(["GET", "GET", "HEAD", "POST"]),
        st.lists(st.sampled_from(["v1", "global-model", "weights", "rounds", "1", "0", "-1",
                                  "99999999999999999999", "..", "%2e%2e", "health", ""]),
                 min_size=1, max_size=5).map(lambda parts: "/" + "/".join(parts))
        | st.sampled_from(["/v1/global-model", "/v1/global-model/weights", "/health",
                           "/v1/global-model/rounds/1/weights"]),
        st.just(b""),
        st.fixed_dictionaries({}, optional={
            "Range": st.sampled_from(["bytes=0-1", "bytes=-5", "bytes=99999999999-", "x"])
            | HEADER_TEXT, "If-None-Match": HEADER_TEXT})),
}


@dataclass
class Result:
    cases: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    transport: Counter[str] = field(default_factory=Counter)
    rss_before_mb: float = 0.0
    rss_after_mb: float = 0.0
    tracebacks: int = 0
    seconds: float = 0.0


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for {pid}")


def tracebacks(directory: Path) -> int:
    return sum(path.read_text(errors="replace").count("Traceback")
               for path in directory.rglob("*") if path.is_file()
               and (path.suffix == ".log" or path.name in ("stdout", "stderr")))


def wait_for(url: str, process: subprocess.Popen[bytes], seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited ({process.returncode}) before answering")
        try:
            httpx.get(url, timeout=5)
            return
        except httpx.HTTPError:
            time.sleep(0.5)
    raise RuntimeError(f"nothing answered at {url}")


@contextmanager
def started(args: list[str], home: Path, env: dict[str, str], probe: str
            ) -> Iterator[subprocess.Popen[bytes]]:
    """`meancache ARGS` in its own process (data in ``home``), until the block ends."""
    home.mkdir(parents=True, exist_ok=True)
    environment = {**os.environ, "MEANCACHE_DATA_DIR": str(home / "data"),
                   "MEANCACHE_CONFIG_DIR": str(home / "config"), "HF_HUB_OFFLINE": "1",
                   "MEANCACHE_ENCODER_MODEL": "minilm", **env}
    with (home / "stdout").open("wb") as out, (home / "stderr").open("wb") as err:
        process = subprocess.Popen([sys.executable, "-m", "meancache", *args], env=environment,
                                   stdout=out, stderr=err)
        try:
            wait_for(probe, process)
            yield process
        finally:
            process.terminate()
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def fuzz(name: str, url: str, pid: int, home: Path, cases: int, draw_seed: int) -> Result:
    """Send ``cases`` drawn cases (after WARM_UP unmeasured ones) to ``url``, each on a
    new connection with its path sent byte for byte (http.client: httpx would resolve
    dot segments and refuse some paths)."""
    result = Result()
    host, port = url.removeprefix("http://").split(":")

    def send(case: Case, into: Result | None) -> None:
        connection = http.client.HTTPConnection(host, int(port), timeout=120)
        try:
            connection.request(case.method, case.path, body=case.body or None,
                               headers=case.headers)
            answer = connection.getresponse()
            answer.read()
        except (OSError, http.client.HTTPException) as exc:
            if into is not None:
                into.transport[type(exc).__name__] += 1
        else:
            if into is not None:
                into.statuses[str(answer.status)] += 1
        finally:
            connection.close()
        if into is not None:
            into.cases += 1

    def run(count: int, into: Result | None, offset: int) -> None:
        @settings(max_examples=count, database=None, deadline=None, phases=[Phase.generate],
                  suppress_health_check=list(HealthCheck))
        @seed(draw_seed + offset)
        @given(STRATEGIES[name])
        def one(case: Case) -> None:
            send(case, into)

        one()

    run(WARM_UP, None, 1)
    result.rss_before_mb, before = rss_mb(pid), tracebacks(home)
    start = time.monotonic()
    run(cases, result, 0)
    result.seconds = time.monotonic() - start
    result.rss_after_mb, result.tracebacks = rss_mb(pid), tracebacks(home) - before
    return result


def superlink_ready(fleet: int, server: subprocess.Popen[bytes], seconds: float = 600
                    ) -> None:
    """Until the SuperLink behind the gateway answers (the gateway listens first and
    answers 502 meanwhile): an empty get-run, which the SuperLink refuses with 401."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"`fl server` exited ({server.returncode})")
        try:
            if httpx.post(f"http://127.0.0.1:{fleet}/v1/fleet/get-run",
                          timeout=30).status_code != 502:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise RuntimeError("the SuperLink never answered through the gateway")


def free_port() -> int:
    from meancache.shared.processes import free_port as free

    return free()


def signed_checkpoint(home: Path) -> None:
    """One global model, signed by the server's own key, where `fl server` serves it."""
    import torch
    from meancache.shared.fl.checkpoint import save_checkpoint
    from meancache.shared.fl.signing import server_key, sign

    root = home / "data" / "fl-server" / "checkpoints"
    key = server_key(root)
    save_checkpoint(root, 1, {"layer.weight": torch.zeros(8, 8)}, 0.8, "minilm", 1,
                    sign=lambda meta: sign(meta, key))


def run_servers(names: list[str], cases: int, draw_seed: int, work: Path
                ) -> dict[str, Result]:
    results: dict[str, Result] = {}
    up_port = free_port()
    up_url = f"http://127.0.0.1:{up_port}"
    if {"upstream", "proxy"} & set(names):
        with started(["upstream", "serve", "--model", MODEL, "--port", str(up_port),
                      "--default-max-tokens", str(ANSWER_TOKENS)], work / "upstream", {},
                     f"{up_url}/health") as upstream:
            if "upstream" in names:
                note(f"upstream: {cases} cases")
                results["upstream"] = fuzz("upstream", up_url, upstream.pid, work / "upstream",
                                           cases, draw_seed)
            if "proxy" in names:
                port = free_port()
                with started(["proxy", "--port", str(port), "--upstream", up_url],
                             work / "proxy", {"MEANCACHE_ANSWER_MAX_TOKENS": "8"},
                             f"http://127.0.0.1:{port}/v1/models") as proxy:
                    note(f"proxy: {cases} cases")
                    results["proxy"] = fuzz("proxy", f"http://127.0.0.1:{port}", proxy.pid,
                                            work / "proxy", cases, draw_seed)
    if {"gateway", "endpoint"} & set(names):
        fleet, control, model = free_port(), free_port(), free_port()
        signed_checkpoint(work / "fl")
        with started(["fl", "server", "--port", str(fleet), "--control-port", str(control),
                      "--model-port", str(model)], work / "fl", {},
                     f"http://127.0.0.1:{model}/health") as server:
            superlink_ready(fleet, server)
            for name, port in (("gateway", fleet), ("endpoint", model)):
                if name in names:
                    note(f"{name}: {cases} cases")
                    results[name] = fuzz(name, f"http://127.0.0.1:{port}", server.pid,
                                         work / "fl", cases, draw_seed)
    return results


def main() -> None:
    parser = base_parser(__doc__)
    parser.add_argument("--cases", type=int, help="drawn cases per server")
    parser.add_argument("--servers", nargs="+", choices=SERVERS, default=SERVERS)
    parser.set_defaults(seed=None)  # a standing target: new cases each run, unless replayed
    args = apply_defaults(parser.parse_args(), {"cases": 1000}, {"cases": 50})
    args.seed = secrets.randbits(32) if args.seed is None else args.seed
    work = args.cache_dir / "fuzz-servers" / str(os.getpid())
    note(f"seed {args.seed} (`--seed {args.seed}` replays these cases); {machine_load()}")
    results = run_servers(args.servers, args.cases, args.seed, work)
    heading(f"Fuzzing each server on loopback: {args.cases} drawn cases each (seed "
            f"{args.seed}), hypothesis strategies of tests/support/fuzz.py; {machine_load()}")
    table = make_table(["server", "cases", "2xx", "3xx", "4xx", "5xx", "transport errors",
                        "tracebacks in logs", "RSS after warm-up MB", "RSS at end MB",
                        "growth MB", "seconds"])
    for name in args.servers:
        r = results[name]
        by_class = Counter(f"{s[0]}xx" for s in r.statuses.elements())
        table.add_row(name, str(r.cases), *(str(by_class[f"{c}xx"]) for c in "2345"),
                      str(sum(r.transport.values())), str(r.tracebacks),
                      f"{r.rss_before_mb:.0f}", f"{r.rss_after_mb:.0f}",
                      f"{r.rss_after_mb - r.rss_before_mb:+.1f}", f"{r.seconds:.0f}")
    print_table(table)
    for name in args.servers:
        r = results[name]
        print(f"{name}: statuses {dict(sorted(r.statuses.items()))}"
              + (f"; transport {dict(r.transport)}" if r.transport else ""))
    print(f"logs and outputs: {work}")
    print_command()


if __name__ == "__main__":
    main()
