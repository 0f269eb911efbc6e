"""Precision ``auto`` (the default of `upstream serve` and the chat's embedded upstream):
int4 where the architecture has a decode graph (Gemma 3; tests/upstream/test_onnx_decode.py
loads tiny-gemma3 with it), else fp16-int8 where the output layer is linear, else float32;
and the server says what it chose."""

import re
import subprocess
import sys

import httpx
import torch
from meancache.shared.processes import free_port
from meancache.upstream.compact_weights import ShortlistOutput
from meancache.upstream.model_loading import load_model
from meancache.upstream.precision import DEFAULT_PRECISION, choose_precision
from meancache.upstream.server.serve import describe

from tests.support.servers import wait_for_port


def test_auto_compacts_an_architecture_without_a_decode_graph() -> None:
    loaded = load_model("builtin:tiny", device="cpu", precision="auto")
    assert loaded.precision == "fp16-int8"
    assert isinstance(loaded.model.get_output_embeddings(), ShortlistOutput)
    assert not any(isinstance(m, torch.nn.Linear) for m in loaded.model.modules())
    assert loaded.decoder is None
    # Counted as loaded, as in an explicit fp16-int8 (the packed weights are no parameters).
    assert loaded.parameters == load_model("builtin:tiny", device="cpu").parameters
    assert "fp16-int8" in describe(loaded)


def test_auto_keeps_float32_for_a_model_without_a_linear_output_layer() -> None:
    # A compacted model's output layer is a ShortlistOutput, not an nn.Linear: nothing
    # for fp16-int8 to pack, and llama has no int4 graph.
    model = load_model("builtin:tiny", device="cpu", precision="fp16-int8").model
    assert choose_precision(model, "auto") == "float32"


def test_a_named_precision_is_served_as_named() -> None:
    model = load_model("builtin:tiny-gemma3", device="cpu").model
    for precision in ("float32", "fp16-int8", "int4"):
        assert choose_precision(model, precision) == precision
    loaded = load_model("builtin:tiny-gemma3", device="cpu")  # load_model's own default
    assert loaded.precision == "float32" and loaded.decoder is None


def test_upstream_serve_defaults_to_auto_and_says_what_it_chose() -> None:
    assert DEFAULT_PRECISION == "auto"
    port = free_port()
    command = [sys.executable, "-m", "meancache", "upstream", "serve", "--model",
               "builtin:tiny", "--port", str(port)]
    with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as process:
        try:
            assert process.stderr is not None
            seen = []
            for line in process.stderr:  # until the start line (or the process ends)
                seen.append(line)
                if "meancache upstream: serving" in line:
                    break
            assert "fp16-int8" in seen[-1], seen
            wait_for_port(port)
            base = f"http://127.0.0.1:{port}"
            model = httpx.get(f"{base}/v1/models", timeout=60).json()["data"][0]
            assert model["meancache"]["precision"] == "fp16-int8"
            metrics = httpx.get(f"{base}/metrics", timeout=60).text
            assert re.search(r'^meancache_upstream_model_info\{[^}]*precision="fp16-int8"',
                             metrics, re.MULTILINE), metrics
        finally:
            process.terminate()
