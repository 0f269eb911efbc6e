"""The encoder's parameters read from its files, without building the pipeline.

Where only the tensors matter (the FL server averages weights and never embeds a text),
building the ``SentenceTransformer`` costs importing sentence-transformers and
transformers (about 6 CPU-s a process) for nothing. The files a sentence-transformers
directory holds name each module's tensors relative to that module; the pipeline's
parameter names prefix them with the module's index, and for the ``Transformer`` module
with ``model.``, the attribute sentence-transformers >= 6 keeps its Hugging Face model in.
That rule is checked against the built pipeline (tests/fl_server/test_fl.py), so a
sentence-transformers that names its parameters otherwise fails a test, not a run.
"""

import json
from pathlib import Path
from typing import TYPE_CHECKING

from meancache.shared.errors import EncoderError

if TYPE_CHECKING:
    import torch

# the Transformer module's class, whichever module path a version saved it under
# ("sentence_transformers.models.Transformer", "...base.modules.transformer.Transformer")
_TRANSFORMER = "Transformer"
_HF_MODEL = "model."  # sentence_transformers.models.Transformer.model


def encoder_tensors(model_dir: Path) -> "dict[str, torch.Tensor]":
    """Every tensor of the model in ``model_dir`` (its parameters and its persistent
    buffers), float32 on the CPU, by the name ``SentenceTransformer.named_parameters()``
    gives it."""
    try:
        modules = json.loads((model_dir / "modules.json").read_text())
        located = [(str(m["idx"]), model_dir / m["path"], m["type"]) for m in modules]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise EncoderError(f"could not read the modules of the embedding model in "
                           f"{model_dir}: {exc}; check that the directory holds a complete "
                           "sentence-transformers model") from exc
    tensors: dict[str, torch.Tensor] = {}
    for idx, directory, kind in located:
        transformer = kind.rsplit(".", 1)[-1] == _TRANSFORMER
        prefix = f"{idx}.{_HF_MODEL}" if transformer else f"{idx}."
        for name, value in _module_tensors(directory, transformer).items():
            tensors[prefix + name] = value.float() if value.is_floating_point() else value
    return tensors


def _module_tensors(directory: Path, required: bool) -> "dict[str, torch.Tensor]":
    """One module's saved tensors (safetensors, sharded or not; else PyTorch's pickle
    format, read with ``weights_only``). Pooling and Normalize save none."""
    import torch
    from safetensors.torch import load_file

    files = sorted(directory.glob("model*.safetensors"))
    try:
        if files:
            return {k: v for f in files for k, v in load_file(str(f)).items()}
        if (directory / "pytorch_model.bin").is_file():
            return torch.load(directory / "pytorch_model.bin", map_location="cpu",
                              weights_only=True)
    except Exception as exc:  # the readers raise many types for a damaged file
        raise EncoderError(f"could not read the embedding model's weights in {directory}: "
                           f"{exc}") from exc
    if required:
        raise EncoderError(f"the embedding model in {directory} has no weights file "
                           "(model.safetensors or pytorch_model.bin)")
    return {}
