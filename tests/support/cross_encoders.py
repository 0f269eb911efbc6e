"""Tiny cross-encoder runs' inputs: QQP-shaped pairs made from templates and a random
2-layer backbone over MiniLM's vocabulary (the teacher's and the student's mechanics need
text and a transformer, not QQP or a real model)."""

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

SUBJECTS = ["France", "Spain", "Peru", "Japan", "Kenya", "Chile", "Norway", "Egypt",
            "Canada", "India", "Italy", "Ghana"]


def qqp_shaped_pairs(directory: Path) -> Path:
    """Train and dev rows with QQP's fields, from templates."""
    rows = []
    for i, subject in enumerate(SUBJECTS):
        other = SUBJECTS[(i + 1) % len(SUBJECTS)]
        rows.append({"q1": f"What is the capital of {subject}?",
                     "q2": f"Which city is the capital of {subject}?", "label": 1,
                     "split": "train"})
        rows.append({"q1": f"How many people live in {subject}?",
                     "q2": f"How many people live in {other}?", "label": 0, "split": "train"})
        rows.append({"q1": f"What language is spoken in {subject}?",
                     "q2": f"Which language do people speak in {subject}?",
                     "label": i % 2, "split": "dev"})
    path = directory / "pairs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def tiny_backbone(directory: Path, kind: str) -> Path:
    """A 2-layer, 32-wide random BERT (``"bert"``, with segment ids), MPNet (``"mpnet"``)
    or Gemma 3 decoder (``"gemma"``, causal, one sliding-window and one global layer) over
    MiniLM's vocabulary, saved with MiniLM's tokenizer."""
    import torch
    from meancache.shared.encoder import packaged_minilm_dir
    from transformers import (
        BertConfig,
        BertModel,
        Gemma3TextConfig,
        Gemma3TextModel,
        MPNetConfig,
        MPNetModel,
    )

    torch.manual_seed(0)
    sizes = {"vocab_size": 30522, "hidden_size": 32, "num_hidden_layers": 2,
             "num_attention_heads": 2, "intermediate_size": 64}
    model = {
        "bert": lambda: BertModel(BertConfig(**sizes, max_position_embeddings=64)),
        "mpnet": lambda: MPNetModel(MPNetConfig(**sizes, max_position_embeddings=66,
                                                pad_token_id=0)),
        "gemma": lambda: Gemma3TextModel(Gemma3TextConfig(
            **sizes, num_key_value_heads=1, head_dim=16, max_position_embeddings=64,
            sliding_window=8, layer_types=["sliding_attention", "full_attention"],
            pad_token_id=0)),
    }[kind]()
    target = directory / kind
    model.save_pretrained(target)
    shutil.copy(packaged_minilm_dir() / "tokenizer.json", target / "tokenizer.json")
    return target


def checkpoint_state(out: Path, record_file: str) -> dict:
    """The state a run's record names as its last checkpoint."""
    import torch

    record = json.loads((out / record_file).read_text())
    return torch.load(out / record["checkpoint"]["file"], weights_only=True)


def assert_same_state(a: dict, b: dict) -> None:
    """Bit-equal weights, optimiser moments, schedule, RNG and position."""
    import torch

    assert a["position"]["step"] == b["position"]["step"]
    assert a["model"].keys() == b["model"].keys()
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), name
    for key, moments in a["optimiser"]["state"].items():
        for name, value in moments.items():
            assert torch.equal(value, b["optimiser"]["state"][key][name]), (key, name)
    assert a["schedule"] == b["schedule"]
    assert torch.equal(a["torch_rng"], b["torch_rng"])


@pytest.fixture(autouse=True)
def keep_torch_threads() -> Iterator[None]:
    """A run sets torch's thread count; the tests after one keep theirs."""
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)
