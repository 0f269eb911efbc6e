"""The one way meancache replaces a file (shared.files): all of the new content or the old
file, never a mix, and nothing left beside it."""

import json
from pathlib import Path

import numpy as np
import pytest
from meancache.shared.files import atomic_path, atomic_write, write_atomic, write_json_atomic


def test_a_write_replaces_the_file_and_leaves_nothing_beside_it(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    write_json_atomic(path, {"answer": "größer"})
    write_json_atomic(path, {"answer": "kleiner"}, durable=True)
    assert json.loads(path.read_text(encoding="utf-8")) == {"answer": "kleiner"}
    write_atomic(tmp_path / "export.jsonl", "a\nb\n")
    with atomic_write(tmp_path / "vectors.npy", durable=True) as fh:
        np.save(fh, np.eye(2, dtype=np.float32), allow_pickle=False)
    assert np.load(tmp_path / "vectors.npy").tolist() == [[1, 0], [0, 1]]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "export.jsonl", "state.json", "vectors.npy"]


def test_a_write_that_fails_keeps_the_old_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"old")
    with pytest.raises(RuntimeError), atomic_write(path) as fh:
        fh.write(b"half of the new")
        raise RuntimeError("disk full")
    with pytest.raises(RuntimeError), atomic_path(path) as partial:
        partial.write_bytes(b"a writer that takes a file name")
        raise RuntimeError("killed")
    assert path.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["model.onnx"]
