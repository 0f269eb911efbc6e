"""The suite under pytest-xdist (`-n auto` in pyproject.toml): each worker is a process of
its own with its own session fixtures, so the cores are shared out between the workers,
and the tests of a module that builds state once for the module run on one worker."""

import importlib
import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

# Scopes whose state a module builds for itself: splitting that module over two workers
# would build it twice (a trained LM, a SuperLink, a server on a model).
MODULE_STATE = ("package", "module", "class")
# Each worker holds its own encoders, tiny models and servers (about 1 GB): more workers
# than this would need more memory than a CI machine or a laptop has to spare.
MAX_WORKERS = 4


def workers() -> int:
    """`-n auto`: one worker per core this process may run on (xdist's own count can
    take a 2-vCPU machine for one core) and one more, at most MAX_WORKERS, unless
    PYTEST_XDIST_AUTO_NUM_WORKERS says how many. Part of the suite waits rather than
    computes (servers and SuperNodes starting, Flower's 3 s polls and 30 s heartbeats),
    but most of those waits run child processes that compute: the extra worker computes
    while one waits. A second extra one only added its collection and session fixtures
    (27 Nov 2026, 2 cores: 433 and 440 s with 3 workers, 453 and 504 s with 4)."""
    chosen = os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS")  # xdist's own hook reads it,
    if chosen:  # but this one, in conftest.py, answers first
        return int(chosen)
    return max(1, min(len(os.sched_getaffinity(0)) + 1, MAX_WORKERS))


def share_cores() -> None:
    """Give each worker its share of the cores for torch's and onnxruntime's compute
    threads (OMP_NUM_THREADS, read when torch is imported and by the encoder's session);
    more threads than cores only contend. Set before anything imports torch, and inherited
    by the `meancache` processes tests start. A value set outside (scripts/ci_matrix.sh's
    one-thread run) is kept."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers > 1:
        share = str(max(1, (os.cpu_count() or 1) // workers))
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(variable, share)


def cache_bytecode() -> None:
    """Let the suite's processes keep the bytecode of what they import, whatever the shell
    says. With PYTHONDONTWRITEBYTECODE set (some sandboxes and CI images set it) and an
    install that compiled nothing (.ci/run's PIP_COMPILE=0), every process the suite
    starts (its workers, `meancache` commands, servers, SuperNodes, Ray's workers) compiles
    torch, transformers and Flower from source again: about 12 CPU-s a process, half of
    CI's CPU time. Set before xdist starts the workers, which inherit the environment."""
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


# What every worker imports while it collects (torch, transformers, sentence-transformers,
# Flower, the OpenAI SDK, Textual, Hypothesis, through the suite's helpers).
COLLECTION_IMPORTS = ("tests.support.servers", "tests.support.fl", "hypothesis", "openai",
                      "textual.app")


def compile_before_workers(config: pytest.Config) -> None:
    """On xdist's controller, before it starts the workers: import what each of them will
    import while collecting, so that on a fresh install (no bytecode yet) that code is
    compiled once, not by every worker at the same moment (about 14 CPU-s each)."""
    if hasattr(config, "workerinput") or not config.getoption("numprocesses", None):
        return
    for name in COLLECTION_IMPORTS:
        importlib.import_module(name)


def builds_module_state(item: pytest.Item) -> bool:
    """Whether ``item`` uses a fixture that lives longer than one test and belongs to its
    module: a module- or class-scoped one, or a session-scoped one its module defines
    (the session fixtures of tests/conftest.py are built once per worker anyway)."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    for definitions in info.name2fixturedefs.values():
        for definition in definitions:
            if definition.scope in MODULE_STATE or (
                    definition.scope == "session" and definition.baseid.endswith(".py")):
                return True
    return False


def group_modules_with_state(items: list[pytest.Item]) -> None:
    """Mark the tests that use a module's state with that module's ``xdist_group``:
    `--dist loadgroup` runs each group on one worker (the state is built once), and
    spreads every other test on its own."""
    for item in items:
        if builds_module_state(item):
            item.add_marker(pytest.mark.xdist_group(item.nodeid.split("::")[0]))


UNGROUPED = pytest.StashKey[set[str]]()


def check_groups_reached_xdist(session: pytest.Session) -> None:
    """On a worker, after xdist has read the groups: note each grouped test whose id lacks
    xdist's ``@group`` suffix, the only way its controller learns of the group, so that
    fail_ungrouped fails it. pytest 9.2 made node ids structured and xdist 3.8's suffix
    then silently stopped taking (pytest-dev/pytest-xdist#1386): each module's state was
    built on every worker (up to 170 worker-seconds of setups again), unseen for a day."""
    config = session.config
    if hasattr(config, "workerinput") and config.getvalue("loadgroup"):
        config.stash[UNGROUPED] = {
            item.nodeid for item in session.items
            if item.get_closest_marker("xdist_group") is not None and "@" not in item.nodeid}


def fail_ungrouped(item: pytest.Item) -> None:
    """Fail, before its setup builds anything, a test xdist did not group."""
    if item.nodeid in item.config.stash.get(UNGROUPED, set()):
        pytest.fail("pytest-xdist did not keep this test with its module's group: this "
                    "pytest and pytest-xdist no longer agree on --dist loadgroup; pin a "
                    "pytest both support (pyproject.toml, the dev extra)", pytrace=False)


def work_unit(item: pytest.Item) -> str:
    """What `--dist loadgroup` hands a worker at once: the item's group, or the item."""
    names = sorted(str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
                   for mark in item.iter_markers("xdist_group"))
    return "_".join(names) if names else item.nodeid


def start_longest_first(items: list[pytest.Item]) -> None:
    """Order the work units by the seconds their ``slow`` tests declare, then by their
    number of tests (xdist's own order, which `--no-loadscope-reorder` leaves to this):
    a long test handed out last would run on alone while the other workers idle."""
    units = {item.nodeid: work_unit(item) for item in items}
    seconds: Counter[str] = Counter()
    for item in items:
        if (mark := item.get_closest_marker("slow")) is not None:
            if not (mark.args and isinstance(mark.args[0], int | float)):
                raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.slow takes the test's "
                                        "seconds, e.g. @pytest.mark.slow(40)")
            seconds[units[item.nodeid]] += mark.args[0]
    sizes = Counter(units.values())
    items.sort(key=lambda item: (-seconds[units[item.nodeid]], -sizes[units[item.nodeid]]))


# A folder that outlives one run, where built_once keeps what it built: .ci/run's kernels
# rerun takes the encoder exports its first run made (an ONNX graph does not depend on the
# CPU's kernels; the rerun's tests compare what the kernels compute).
BUILT = "MEANCACHE_TESTS_BUILT"


def built_once(factory: pytest.TempPathFactory, name: str,
               build: Callable[[Path], object]) -> Path:
    """A directory of this worker's own that ``build`` filled once for the whole run (or
    the runs sharing the folder BUILT names): the first worker to ask builds it in the
    run's temp dir (the others wait on its lock) and each worker works on a copy, so that
    no worker sees another's later writes."""
    own = factory.mktemp(name)
    if "PYTEST_XDIST_WORKER" not in os.environ and BUILT not in os.environ:
        build(own)
        return own
    # else the run's temp dir, above each worker's own
    run = Path(os.environ[BUILT]) if BUILT in os.environ else factory.getbasetemp().parent
    shared = run / name
    with FileLock(run / f"{name}.lock"):
        if not shared.is_dir():
            partial = run / f"{name}.partial"
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir()
            build(partial)
            partial.rename(shared)
    shutil.copytree(shared, own, dirs_exist_ok=True)
    return own
