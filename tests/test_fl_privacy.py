"""No configuration sends the embedding tables: the rows a device's training touched
would say which tokens its users typed."""

from pathlib import Path

import pytest
from flwr.supercore.inflatable.inflatable_object import get_all_nested_objects
from meancache.client.fl.client_app import app as client_app
from sentence_transformers import SentenceTransformer

from tests.test_fl import (  # noqa: F401 (tiny, tiny_dir: fixtures)
    FEEDBACK,
    device_context,
    device_with_feedback,
    tiny,
    tiny_dir,
    train_message,
)


@pytest.mark.parametrize("top_layers", [0, 1, 2, 3])  # the tiny encoder has 2 layers
def test_no_embedding_row_is_in_any_outgoing_message(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer,  # noqa: F811
    monkeypatch: pytest.MonkeyPatch, top_layers: int
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK)
    context = device_context(tmp_path, tiny_dir)
    context.run_config["top-layers"] = top_layers
    reply = client_app(train_message(tiny, top_layers), context)
    assert not reply.has_error() and reply.content["metrics"]["num-examples"] > 0
    wire = b"".join(o.deflate() for o in get_all_nested_objects(reply).values())
    assert len(wire) > 10_000  # the trained layers did go out
    sent = reply.content["arrays"].to_torch_state_dict()
    assert not [name for name in sent if ".embeddings." in name]
    tokens = tiny.tokenizer(" ".join(q for q, _, _ in FEEDBACK))["input_ids"]
    table = dict(tiny.named_parameters())["0.model.embeddings.word_embeddings.weight"]
    for token in set(tokens):
        assert table[token].detach().numpy().tobytes() not in wire
