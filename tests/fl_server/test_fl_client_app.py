"""The ClientApp on a device with almost no labelled pairs: it takes part in the round
instead of failing it."""

from pathlib import Path

import pytest
from meancache.client.fl.client_app import app as client_app
from sentence_transformers import SentenceTransformer

from tests.support.fl import FEEDBACK, device_context, device_with_feedback, train_message


@pytest.mark.parametrize("pairs", [0, 1])
def test_a_device_with_too_few_pairs_to_hold_any_out_still_replies(
    tmp_path: Path, tiny_dir: Path, tiny: SentenceTransformer,
    monkeypatch: pytest.MonkeyPatch, pairs: int
) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "cfg"))
    device_with_feedback(tmp_path, FEEDBACK[:pairs])
    context = device_context(tmp_path, tiny_dir)
    context.run_config["min-pairs"] = 0
    reply = client_app(train_message(tiny, 1), context)
    assert not reply.has_error(), reply.error
    assert reply.content["metrics"]["skipped"] == 0  # it took part, with what it had
