"""A tiny random-init sentence-transformers model (2 BERT layers, 32 dims) with MiniLM's
tokenizer: for training and FL mechanics in tests, where real weights would be slow."""

from pathlib import Path

import torch
from meancache.shared.encoder import packaged_minilm_dir
from sentence_transformers import SentenceTransformer, models
from transformers import AutoTokenizer, BertConfig, BertModel


def make_tiny_encoder(directory: Path, dropout: float = 0.1) -> Path:
    """``dropout`` 0: training is deterministic, so a test can redo a device's training
    exactly (with BERT's default 0.1 the unseeded dropout moves each run's update)."""
    torch.manual_seed(0)
    raw = directory / "raw"
    tokenizer = AutoTokenizer.from_pretrained(str(packaged_minilm_dir()))
    BertModel(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=2,
                         num_attention_heads=2, intermediate_size=64,
                         max_position_embeddings=128, hidden_dropout_prob=dropout,
                         attention_probs_dropout_prob=dropout)).save_pretrained(raw)
    tokenizer.save_pretrained(raw)
    transformer = models.Transformer(str(raw), max_seq_length=64)
    pooling = models.Pooling(transformer.get_embedding_dimension(), "mean")
    model_dir = directory / "tiny-encoder"
    SentenceTransformer(modules=[transformer, pooling, models.Normalize()]).save(str(model_dir))
    return model_dir
