"""Export the embedding pipeline to ONNX once, check it against PyTorch, and run it.

onnxruntime is what makes a lookup cheap (a few ms per query on 2 CPU cores). The export
uses torch's dynamo exporter: the legacy TorchScript tracer bakes the example's sequence
length into transformers 5.x attention masks and gives wrong embeddings for other lengths.
"""

import contextlib
import io
import logging
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from meancache.shared.encoder.tokens import Tokenized
from meancache.shared.files import atomic_path
from meancache.shared.onnx_session import cpu_session

if TYPE_CHECKING:  # running an export needs no torch; making one does
    from meancache.shared.encoder.pipeline import EmbeddingPipeline

log = logging.getLogger(__name__)

PARITY_MIN_COSINE = 0.999
INT8_PARITY_MIN_COSINE = 0.99  # int8 rounding moves vectors a little; F0.5 is checked apart
PARITY_QUERIES = (
    "What is the capital of France?",
    "hi",
    "How do I reverse a linked list in Python without using extra memory?",
    "Quelle est la meilleure façon d'apprendre une langue étrangère rapidement ?",
    "Explain, step by step and with examples, how public key cryptography lets two "
    "strangers agree on a secret over an open channel that an attacker can read.",
)


def export_pipeline(pipeline: "EmbeddingPipeline", sample: Tokenized, path: Path) -> None:
    """Export to ``path`` atomically (a crash leaves no half-written model behind);
    ``sample``: a small batch of inputs to trace the graph with."""
    import torch

    batch = torch.export.Dim("batch")
    seq = torch.export.Dim("seq", max=4096)
    path.parent.mkdir(parents=True, exist_ok=True)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)  # it warns about torchvision ops we do not use
    with atomic_path(path) as partial, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            pipeline.eval(),
            (torch.from_numpy(sample.input_ids), torch.from_numpy(sample.attention_mask)),
            input_names=["input_ids", "attention_mask"],
            output_names=["unit_embedding"],
            dynamic_shapes=({0: batch, 1: seq}, {0: batch, 1: seq}),
            dynamo=True,
            external_data=False,
            verbose=False,
        )
        program.save(str(partial))
    exporter_log.setLevel(level)


def quantize_attention(source: Path, target: Path) -> None:
    """Write ``source`` with its attention projections in int8 (per-channel weights,
    activations quantised per call), atomically.

    Only those: on MPNet, quantising the feed-forward layers too (whose outputs carry
    outlier activations) drops the median cosine to float32 to 0.915 and dev F0.5 by 0.085,
    while the attention projections alone keep it at 0.999 and F0.5 within 0.001, for 1.34x
    faster embedding (benchmarks/README.md, "int8 encoder").

    Weights keep to 7 bits (``reduce_range``): onnxruntime's u8 x s8 kernel on AVX2 and
    AVX-512 CPUs without VNNI adds pairs of products in 16 bits (VPMADDUBSW) and saturates
    on full 8-bit weights; with 7 bits no pair can (2 x 255 x 64 < 32768), so the same file
    gives the same vectors on every x86-64 CPU (on MiniLM: median cosine to float32
    0.9985 against 0.9989 with 8 bits, minimum 0.9975 over 300 QQP questions).
    """
    import onnx
    from onnxruntime.quantization import QuantType, quantize_dynamic

    graph = onnx.load(str(source)).graph
    shapes = {init.name: tuple(init.dims) for init in graph.initializer}
    square = [node.name for node in graph.node if node.op_type == "MatMul" and any(
        len(shapes.get(name, ())) == 2 and shapes[name][0] == shapes[name][1]
        for name in node.input)]  # (d, d) weights: query, key, value and output projections
    if not square:
        raise ValueError(f"{source} has no attention projections to quantise")
    with atomic_path(target) as partial:
        quantize_dynamic(str(source), str(partial), weight_type=QuantType.QInt8,
                         per_channel=True, reduce_range=True, nodes_to_quantize=square)


class OnnxEmbedder:
    """Runs an exported pipeline with onnxruntime on the CPU; ``backend`` names it."""

    def __init__(self, path: Path, backend: str = "onnx") -> None:
        self.path = path
        self.backend = backend
        self._session = cpu_session(path)

    def __call__(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        (out,) = self._session.run(
            None,
            {"input_ids": input_ids.astype(np.int64),
             "attention_mask": attention_mask.astype(np.int64)},
        )
        return out


def min_parity_cosine(onnx: np.ndarray, reference: np.ndarray) -> float:
    """Smallest cosine between matching rows of two embedding batches."""
    a = onnx / np.linalg.norm(onnx, axis=1, keepdims=True)
    b = reference / np.linalg.norm(reference, axis=1, keepdims=True)
    return float((a * b).sum(1).min())
