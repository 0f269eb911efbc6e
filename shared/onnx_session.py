"""One way to open an ONNX model for on-device inference (the encoder and the verifier)."""

import os
from pathlib import Path
from typing import Any


def cpu_session(path: Path, threads: int = 2) -> Any:
    """An onnxruntime CPU session for ``path``: at most ``threads`` intra-op threads, and
    no more than the cores or OMP_NUM_THREADS (the cap that torch also obeys, set where
    processes share the cores: the test workers), fully optimised, quiet. Threads do not
    spin: a spinning pool keeps a core busy after each run and starves the search that
    follows (and everything else on a 2-core laptop)."""
    import onnxruntime as ort  # the chat's start imports it only when a model is opened

    options = ort.SessionOptions()
    options.intra_op_num_threads = min(threads, os.cpu_count() or 1, omp_threads() or threads)
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.log_severity_level = 3
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def omp_threads() -> int | None:
    """OMP_NUM_THREADS as a positive count; None where unset or not a count."""
    value = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None
