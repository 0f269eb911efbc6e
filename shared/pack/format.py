"""The pack file: one versioned file, read and written only here.

Layout (UTF-8)::

    {"format": "meancache-pack", "version": 1, "model": ..., ...}\\n   <- the manifest
    ["normalised instruction", "answer"]\\n                             <- the body: one
    ...                                                                   entry a line

The manifest's ``body_sha256`` and ``body_bytes`` cover every byte after the manifest
line, so a truncated or altered file is refused before anything of it is used. Entries
are sorted and unique by instruction, which is already normalised (``normalise_query``).
"""

import datetime as dt
import hashlib
import json
import os
from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from meancache.shared.errors import PackCorruptError, PackMismatchError, PackVersionError
from meancache.shared.files import write_atomic
from meancache.shared.query import normalise_query

FORMAT_NAME = "meancache-pack"
FORMAT_VERSION = 1
MAX_MANIFEST_BYTES = 64 * 1024  # a manifest is a few hundred bytes; more means not a pack
MAX_BODY_BYTES = 2**40  # far beyond any pack; a manifest claiming more is not believed
MAX_MODEL_CHARS = 256


@dataclass(frozen=True)
class PackManifest:
    model: str  # the upstream model whose answers the pack holds
    sigma: float  # the NLL budget the instructions were predicted under
    count: int
    created: str  # ISO 8601, UTC
    body_bytes: int
    body_sha256: str
    encoder: str | None = None  # the encoder fingerprint, when the pack carries embeddings
    format: str = FORMAT_NAME
    version: int = FORMAT_VERSION

    @property
    def pack_id(self) -> str:
        """A short name of this pack's content, shown in stats and used as its ETag."""
        return self.body_sha256[:12]

    def to_json(self) -> dict[str, object]:
        return asdict(self)


@dataclass(frozen=True)
class Pack:
    manifest: PackManifest
    answers: dict[str, str]  # normalised instruction -> answer

    def lookup(self, query: str) -> tuple[str, str] | None:
        """The (instruction, answer) whose instruction is ``query`` normalised: O(1)."""
        key = normalise_query(query)
        answer = self.answers.get(key)
        return None if answer is None else (key, answer)


def write_pack(path: Path, entries: Iterable[tuple[str, str]], model: str, sigma: float,
               encoder: str | None = None) -> PackManifest:
    """Write a pack atomically (beside ``path``, fsynced, renamed in); instructions are
    normalised here, and of two that normalise alike the first is kept."""
    answers: dict[str, str] = {}
    for instruction, answer in entries:
        key = normalise_query(instruction)
        if key and answer.strip():
            answers.setdefault(key, answer)
    body = b"".join(json.dumps([key, answers[key]], ensure_ascii=False).encode() + b"\n"
                    for key in sorted(answers))
    manifest = PackManifest(
        model=model, sigma=float(sigma), count=len(answers),
        created=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        body_bytes=len(body), body_sha256=hashlib.sha256(body).hexdigest(), encoder=encoder)
    head = json.dumps(manifest.to_json(), ensure_ascii=False).encode() + b"\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, head + body, durable=True)
    return manifest


def read_manifest(path: Path) -> PackManifest:
    """The manifest alone (the server's listing, and the check before a download is kept)."""
    with _open(path) as fh:
        return _parse_manifest(path, fh.readline(MAX_MANIFEST_BYTES + 1))


def read_pack(path: Path, model: str | None = None, encoder: str | None = None) -> Pack:
    """Read and verify a whole pack; ``model``/``encoder``, when given, must be the pack's."""
    with _open(path) as fh:
        manifest = _parse_manifest(path, fh.readline(MAX_MANIFEST_BYTES + 1))
        check_compatible(path, manifest, model, encoder)
        remaining = os.fstat(fh.fileno()).st_size - fh.tell()
        body = fh.read(manifest.body_bytes + 1) if remaining == manifest.body_bytes else b""
    if remaining != manifest.body_bytes:  # read nothing of a size the manifest lies about
        size = "longer" if remaining > manifest.body_bytes else "shorter"
        raise PackCorruptError(f"{path}: the pack is {size} than its manifest says "
                               f"({manifest.body_bytes} body bytes); "
                               "it was cut short or altered: download it again")
    if hashlib.sha256(body).hexdigest() != manifest.body_sha256:
        raise PackCorruptError(f"{path}: the pack's sha256 does not match its manifest; "
                               "it is damaged: download it again")
    answers: dict[str, str] = {}
    for number, line in enumerate(body.splitlines(), start=2):
        try:
            instruction, answer = json.loads(line)
        except (ValueError, TypeError):
            raise PackCorruptError(f"{path}, line {number}: not an [instruction, answer] "
                                   "pair") from None
        if not isinstance(instruction, str) or not isinstance(answer, str):
            raise PackCorruptError(f"{path}, line {number}: instruction and answer must be "
                                   "text")
        answers[instruction] = answer
    if len(answers) != manifest.count:
        raise PackCorruptError(f"{path}: {len(answers)} distinct entries, the manifest says "
                               f"{manifest.count}")
    return Pack(manifest, answers)


def check_compatible(path: Path, manifest: PackManifest, model: str | None,
                     encoder: str | None) -> None:
    """Refuse a pack answered by another model, or embedded by another encoder."""
    if model is not None and manifest.model != model:
        raise PackMismatchError(f"{path}: the pack holds answers of model {manifest.model!r}, "
                                f"but this device's upstream runs {model!r}; build or "
                                "download a pack for that model")
    if encoder is not None and manifest.encoder is not None and manifest.encoder != encoder:
        raise PackMismatchError(f"{path}: the pack's embeddings come from encoder "
                                f"{manifest.encoder!r}, not this device's {encoder!r}")


def _open(path: Path):  # type: ignore[no-untyped-def]
    try:
        return path.open("rb")
    except OSError as exc:
        raise PackCorruptError(f"cannot read the pack {path}: {exc.strerror}") from None


def _parse_manifest(path: Path, line: bytes) -> PackManifest:
    if len(line) > MAX_MANIFEST_BYTES or not line.endswith(b"\n"):
        raise PackCorruptError(f"{path} is not a meancache pack (no manifest line)")
    try:
        data = json.loads(line)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise PackCorruptError(f"{path} is not a meancache pack (its first line is not "
                               "a JSON manifest)") from None
    return manifest_from_json(data, str(path))


def manifest_from_json(data: object, where: str) -> PackManifest:
    """A manifest from its JSON (a pack's first line, or an upstream's manifest endpoint),
    every field checked for type and range: nothing a server claims is taken on trust."""
    if not isinstance(data, dict) or data.get("format") != FORMAT_NAME:
        raise PackCorruptError(f"{where} is not a meancache pack (no 'format': "
                               f"{FORMAT_NAME!r} in its manifest)")
    version = data.get("version")
    if version != FORMAT_VERSION or not _count(version, FORMAT_VERSION):  # 1.0, True: no
        raise PackVersionError(f"{where}: pack format version {data.get('version')!r} is not "
                               f"the version {FORMAT_VERSION} this meancache reads; update "
                               "meancache or fetch a pack built for it")
    known = {f.name for f in fields(PackManifest)}
    try:
        manifest = PackManifest(**{k: v for k, v in data.items() if k in known})
    except TypeError as exc:
        raise PackCorruptError(f"{where}: the manifest lacks a field ({exc})") from None
    if not (_count(manifest.body_bytes, MAX_BODY_BYTES)
            and _count(manifest.count, manifest.body_bytes)
            and isinstance(manifest.body_sha256, str) and len(manifest.body_sha256) == 64
            and isinstance(manifest.model, str) and len(manifest.model) <= MAX_MODEL_CHARS
            and isinstance(manifest.created, str) and len(manifest.created) <= 64
            and isinstance(manifest.sigma, int | float) and not isinstance(manifest.sigma, bool)
            and (manifest.encoder is None or (isinstance(manifest.encoder, str)
                                              and len(manifest.encoder) <= MAX_MODEL_CHARS))):
        raise PackCorruptError(f"{where}: the manifest has a field of the wrong type or "
                               "out of range")
    return manifest


def _count(value: object, most: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= most
