"""The verifier's network: a BERT backbone reading the pair as one sequence, mean-pooled
(as all-MiniLM-L6-v2 was trained to pool), and one logit: "the same question".

Built from the packaged all-MiniLM-L6-v2 for training, or tiny and random for tests of the
mechanics. Exported to ONNX and quantised to int8 here, so the test models and the shipped
one are made the same way. Imports torch: training and export only, never the client.
"""

import contextlib
import inspect
import io
import logging
import warnings
from pathlib import Path

import torch
from meancache.shared.files import atomic_path
from torch import nn

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


class CrossEncoder(nn.Module):
    """A question pair in, the logit of "the same question" out."""

    def __init__(self, backbone: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)
        # BERT reads the two segments' ids; MPNet has no segment embeddings at all.
        self.segments = "token_type_ids" in inspect.signature(backbone.forward).parameters

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                token_type_ids: torch.Tensor) -> torch.Tensor:
        segments = {"token_type_ids": token_type_ids} if self.segments else {}
        hidden = self.backbone(input_ids=input_ids, attention_mask=attention_mask,
                               **segments).last_hidden_state
        mask = attention_mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        return self.head(pooled).squeeze(-1)


def from_packaged_minilm() -> CrossEncoder:
    """The backbone of the packaged all-MiniLM-L6-v2 (offline), with a fresh head."""
    from meancache.shared.encoder import packaged_minilm_dir

    return from_backbone(packaged_minilm_dir())


def from_backbone(model_dir: Path) -> CrossEncoder:
    """The transformer of a local sentence-transformers or Hugging Face directory (BERT,
    MPNet, a decoder such as Gemma 3, ...; offline, in float32, its pooler dropped where it
    has one, no generation cache), with a fresh head."""
    from transformers import AutoConfig, AutoModel
    from transformers.models.auto.modeling_auto import MODEL_MAPPING
    from transformers.utils import logging as hf_logging

    config = AutoConfig.from_pretrained(str(model_dir), local_files_only=True)
    pooler = "add_pooling_layer" in inspect.signature(MODEL_MAPPING[type(config)]).parameters
    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # the unused pooler's "unexpected keys" report
    try:
        backbone = AutoModel.from_pretrained(
            str(model_dir), config=config, local_files_only=True, dtype=torch.float32,
            **({"add_pooling_layer": False} if pooler else {}))
    finally:
        hf_logging.set_verbosity(verbosity)
    if hasattr(backbone.config, "use_cache"):
        backbone.config.use_cache = False  # a decoder would keep every layer's keys
    return CrossEncoder(backbone)


def export_onnx(model: CrossEncoder, path: Path) -> None:
    """Float32 ONNX with dynamic batch and length, atomically. The dynamo exporter: the
    legacy tracer bakes the example's length into transformers 5.x attention masks."""
    sample = {name: torch.ones(2, 8, dtype=torch.int64) for name in INPUTS}
    sample["token_type_ids"] = torch.zeros(2, 8, dtype=torch.int64)
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=512)
    exporter_log = logging.getLogger("torch.onnx")
    level = exporter_log.level
    exporter_log.setLevel(logging.ERROR)
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as partial, warnings.catch_warnings(), \
            contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        program = torch.onnx.export(
            model.eval(), tuple(sample[name] for name in INPUTS), input_names=list(INPUTS),
            output_names=["logit"], dynamic_shapes=tuple({0: batch, 1: seq} for _ in INPUTS),
            dynamo=True, external_data=False, verbose=False)
        program.save(str(partial))
    exporter_log.setLevel(level)


def quantize_int8(source: Path, target: Path) -> None:
    """Every MatMul and the embedding tables in int8 (per-channel weights, activations
    quantised per call), atomically. Weights keep to 7 bits (``reduce_range``), so that
    onnxruntime's u8 x s8 kernels on AVX2 and AVX-512 CPUs without VNNI cannot saturate and
    the same file gives the same probabilities on every x86-64 CPU: those kernels add pairs
    of products in 16 bits (VPMADDUBSW), and with 7-bit weights no pair can overflow
    (2 x 255 x 64 < 32768)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with atomic_path(target) as partial:
        quantize_dynamic(str(source), str(partial), weight_type=QuantType.QInt8,
                         per_channel=True, reduce_range=True,
                         op_types_to_quantize=["MatMul", "Gather"])
