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


def quantize_in_blocks(source: Path, target: Path) -> None:
    """Write ``source`` with every weight matrix in 8-bit blocks, atomically.

    Each block of 128 weights along the input has its own scale, and each token's
    activations are quantised per block too (onnxruntime's MatMulNBits at accuracy level
    4, int8 arithmetic): an outlier stays in its block. Per-tensor dynamic quantisation
    (one scale for a whole call's activations) could not hold MPNet's feed-forward outputs
    (median cosine to float32 0.914, dev F0.5 -0.085), so it was kept to the attention
    projections (0.9988, 1.31x faster). Blocks hold every layer: median cosine 0.9995 (min
    0.998 over 300 QQP questions) at 1.76x the float32 speed for one question (block 256:
    min 0.990; 64: slower), and a token's vector does not depend on the others in its
    batch (benchmarks/README.md, "int8 encoder"). onnxruntime's kernels for 8-bit blocks
    keep each product in its own 16-bit lane on CPUs without VNNI, so no sum saturates
    there either: only the order of float additions differs between CPUs.
    """
    import onnx

    root = logging.getLogger()
    handlers, root_level = list(root.handlers), root.level
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    root.handlers[:] = handlers  # that import calls logging.basicConfig (stderr, INFO)
    root.setLevel(root_level)
    model = onnx.load(str(source))
    weights = {init.name for init in model.graph.initializer if len(init.dims) == 2}
    if not any(node.op_type == "MatMul" and weights & set(node.input)
               for node in model.graph.node):
        raise ValueError(f"{source} has no weight matrices to quantise")
    quantizer = MatMulNBitsQuantizer(model, bits=8, block_size=128, is_symmetric=True,
                                     accuracy_level=4)
    chatter = logging.getLogger("onnxruntime.quantization")  # a line per node it skips
    level = chatter.level
    chatter.setLevel(logging.WARNING)
    try:
        quantizer.process()
    finally:
        chatter.setLevel(level)
    with atomic_path(target) as partial:
        quantizer.model.save_model_to_file(str(partial), use_external_data_format=False)


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
