"""The on-device ONNX sessions take no more compute threads than asked, than the cores,
or than OMP_NUM_THREADS: processes that share the cores (the test workers) set it."""

import os
from pathlib import Path

import pytest
from meancache.shared.onnx_session import cpu_session

from tests.support.paths import REPO

MODEL = REPO / "shared" / "verifier" / "artefact" / "verifier.onnx"


def intra_op_threads(path: Path, threads: int = 2) -> int:
    return cpu_session(path, threads).get_session_options().intra_op_num_threads


@pytest.mark.parametrize("value", [None, "", "0", "many"])
def test_without_a_cap_a_session_takes_what_it_asks_up_to_the_cores(
        monkeypatch: pytest.MonkeyPatch, value: str | None) -> None:
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert intra_op_threads(MODEL) == min(2, os.cpu_count() or 1)
    assert intra_op_threads(MODEL, threads=1) == 1


def test_omp_num_threads_caps_a_session(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    assert intra_op_threads(MODEL) == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "8")  # a cap above the ask changes nothing
    assert intra_op_threads(MODEL) == min(2, os.cpu_count() or 1)
