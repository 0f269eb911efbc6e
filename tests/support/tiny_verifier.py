"""A tiny random-init cross-encoder (2 BERT layers, 32 dims), exported and quantised the
way the shipped verifier is, with a card naming its hash: the verifier's mechanics in
tests, where the real one's weights would say nothing about the mechanics."""

import json
from pathlib import Path

import pytest
import torch
from meancache.shared.files import sha256_file
from meancache.shared.verifier.model import CrossEncoder, export_onnx, quantize_int8
from meancache.shared.verifier.runtime import CARD_FILE, MODEL_FILE

from tests.support.parallel import built_once


def tiny_random(seed: int = 0) -> CrossEncoder:
    """A two-layer, 32-wide random model over MiniLM's vocabulary: tests of the mechanics."""
    from transformers import BertConfig, BertModel

    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64,
                        max_position_embeddings=512)
    return CrossEncoder(BertModel(config, add_pooling_layer=False))


def make_tiny_verifier(directory: Path, threshold: float = 0.5, distinct: bool = False
                       ) -> Path:
    """``directory`` holding verifier.onnx and its card; returns ``directory``.
    ``distinct``: every bias and LayerNorm drawn at random too, as in a trained model (the
    exporter folds equal tensors, a fresh model's zero biases among them, into one
    nameless constant, which the float weights are then not read back from)."""
    directory.mkdir(parents=True, exist_ok=True)
    full = directory / "float32.onnx"
    model = tiny_random()
    if distinct:
        generator = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for param in model.parameters():
                if param.ndim == 1:
                    param.add_(0.05 * torch.randn(param.shape, generator=generator))
    export_onnx(model, full)
    quantize_int8(full, directory / MODEL_FILE)
    full.unlink()
    card = {"sha256": sha256_file(directory / MODEL_FILE), "threshold": threshold}
    (directory / CARD_FILE).write_text(json.dumps(card), encoding="utf-8")
    return directory


def built_tiny_verifier(factory: pytest.TempPathFactory, threshold: float = 0.5,
                        distinct: bool = False) -> Path:
    """A directory of the caller's own holding the tiny verifier, its card saying
    ``threshold``: built once for the whole run (tests.support.parallel.built_once; the
    seeded model exports and quantises to the same bytes every time, and each build costs
    about 7 CPU-s, 14 with the exporter's imports), then copied."""
    directory = built_once(factory, "tiny-verifier-distinct" if distinct else "tiny-verifier",
                           lambda into: make_tiny_verifier(into, distinct=distinct))
    card = json.loads((directory / CARD_FILE).read_text(encoding="utf-8"))
    (directory / CARD_FILE).write_text(json.dumps(card | {"threshold": threshold}),
                                       encoding="utf-8")
    return directory
