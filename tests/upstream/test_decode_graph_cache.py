"""The int4 decode graph kept on disk (upstream.decode_graph_cache): a second start reads
it instead of exporting again, a damaged copy is rebuilt (never loaded), graphs of other
weights get their own name, and only the most recently used stay."""

import logging
from pathlib import Path

import pytest
import torch
from meancache.upstream import decode_graph_cache, onnx_decode
from meancache.upstream.builtin import builtin_model
from meancache.upstream.decode_graph_cache import graph_dir
from meancache.upstream.model_loading import LoadedModel, load_model
from meancache.upstream.prompt_cache.engine import PromptCacheEngine

# Not a kernels test (CI's AVX2 rerun): each comparison here is of two decodes through the
# same kernels in one process (a kept graph against a rebuilt one); the int4 graph's
# results against PyTorch's, which vary by instruction set, are test_onnx_decode's.


@pytest.fixture
def exports(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the real exporter's calls (each export and quantisation of a graph)."""
    calls: list[int] = []
    real = onnx_decode.export_step

    def counted(*args: object, **kwargs: object) -> bytes:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(onnx_decode, "export_step", counted)
    return calls


def decoded(loaded: LoadedModel, steps: int = 6) -> list[torch.Tensor]:
    """The logits of ``steps`` greedy decode steps through the int4 decoder."""
    assert loaded.decoder is not None
    engine = PromptCacheEngine(loaded)
    prepared = engine.prepare_messages([{"role": "user", "content": "rivers and bridges"}])
    logits, seen, cache = engine.prefill(prepared)
    position, out = max(prepared.new_positions), []
    for _ in range(steps):
        position += 1
        logits, seen = loaded.decoder.step(int(logits.argmax()), position, seen, cache,
                                           engine.kv_format)
        out.append(logits)
    return out


def graphs(data_dir: Path) -> list[Path]:
    return sorted(graph_dir(data_dir).glob("*.onnx"))


def start(data_dir: Path) -> LoadedModel:
    return load_model("builtin:tiny-gemma3", device="cpu", data_dir=data_dir,
                      precision="int4")


def test_a_second_start_reads_the_kept_graph_and_decodes_the_same(
        tmp_path: Path, exports: list[int]) -> None:
    first = start(tmp_path)
    assert len(exports) == 1
    [path] = graphs(tmp_path)
    inode = path.stat().st_ino
    second = start(tmp_path)
    assert len(exports) == 1  # not exported again
    assert graphs(tmp_path) == [path] and path.stat().st_ino == inode  # not rewritten
    for ours, theirs in zip(decoded(second), decoded(first), strict=True):
        assert torch.equal(ours, theirs)


@pytest.mark.parametrize("damage", ["truncated", "flipped", "record missing", "graph missing"])
def test_a_damaged_graph_is_rebuilt_with_a_log_line_never_loaded(
        tmp_path: Path, exports: list[int], caplog: pytest.LogCaptureFixture,
        damage: str) -> None:
    reference = decoded(start(tmp_path))
    [path] = graphs(tmp_path)
    record = path.with_name(path.name + ".sha256")
    data = path.read_bytes()
    if damage == "truncated":
        path.write_bytes(data[:len(data) // 2])
    elif damage == "flipped":  # same length, one byte changed: only the hash can tell
        path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    elif damage == "record missing":
        record.unlink()
    else:
        path.unlink()
    with caplog.at_level(logging.WARNING, logger=decode_graph_cache.__name__):
        rebuilt = start(tmp_path)
    assert len(exports) == 2
    assert "building it again" in caplog.text and path.name in caplog.text
    assert decode_graph_cache._intact(path) is not None  # the rebuilt one is whole again
    for ours, theirs in zip(decoded(rebuilt), reference, strict=True):
        assert torch.equal(ours, theirs)


def test_other_weights_get_their_own_graph_and_only_the_latest_stay(
        tmp_path: Path, exports: list[int]) -> None:
    directory = tmp_path / "graphs"
    leftover = directory / ".abc.onnx.123-456.partial"  # what a killed write leaves
    directory.mkdir()
    leftover.write_bytes(b"half a graph")
    written = []  # each set of weights' graph, in the order they were built
    for seed in range(decode_graph_cache.KEEP + 1):
        before = set(directory.glob("*.onnx"))
        onnx_decode.onnx_decoder(builtin_model("tiny-gemma3", seed=seed), cache_dir=directory)
        written += list(set(directory.glob("*.onnx")) - before)
    assert len(exports) == len(set(written)) == decode_graph_cache.KEEP + 1  # one per weights
    kept = sorted(directory.glob("*.onnx"))
    assert kept == sorted(written[1:])  # the least recently used went
    assert sorted(directory.glob("*.onnx.sha256")) == [p.with_name(p.name + ".sha256")
                                                       for p in kept]
    assert not leftover.exists()
    onnx_decode.onnx_decoder(builtin_model("tiny-gemma3", seed=1), cache_dir=directory)
    assert len(exports) == decode_graph_cache.KEEP + 1  # a kept one is read back
