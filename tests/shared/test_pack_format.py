"""The pack file and the instruction normalisation both sides share."""

import json
from pathlib import Path

import pytest
from meancache.shared.errors import PackCorruptError, PackMismatchError, PackVersionError
from meancache.shared.pack import read_manifest, read_pack, write_pack
from meancache.shared.query import normalise_query

ENTRIES = [("What is Python?", "A programming language."),
           ("how do I boil an egg", "Put it in boiling water for 8 minutes."),
           ("WHAT IS PYTHON", "a duplicate that must lose to the first")]


@pytest.mark.parametrize(("text", "key"), [
    ("  What   is\tPython?  ", "what is python"),
    ("What is Python?!", "what is python"),
    ("Ｗｈａｔ ｉｓ Ｐｙｔｈｏｎ？", "what is python"),  # full-width forms (NFKC)
    ("STRASSE or Straße", "strasse or strasse"),  # casefold
    ("Is 3.5 > C++?", "is 3.5 > c++"),  # inner punctuation kept
    ("?!...", ""),
])
def test_normalisation(text: str, key: str) -> None:
    assert normalise_query(text) == key


def test_round_trip_normalises_and_keeps_the_first_of_duplicates(tmp_path: Path) -> None:
    path = tmp_path / "p.mcpack"
    manifest = write_pack(path, ENTRIES, model="builtin:tiny", sigma=12.5)
    assert manifest.count == 2
    pack = read_pack(path, model="builtin:tiny")
    assert pack.manifest == manifest == read_manifest(path)
    assert pack.lookup("what is python") == ("what is python", "A programming language.")
    assert pack.lookup("How do I boil an egg?")[1].startswith("Put it")
    assert pack.lookup("what is rust") is None
    assert [p.name for p in tmp_path.iterdir()] == ["p.mcpack"]  # nothing left beside it


def test_a_truncated_or_altered_pack_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.mcpack"
    write_pack(path, ENTRIES, model="m", sigma=1.0)
    data = path.read_bytes()
    path.write_bytes(data[:-5])
    with pytest.raises(PackCorruptError, match="shorter"):
        read_pack(path)
    path.write_bytes(data.replace(b"boiling", b"cooling"))
    with pytest.raises(PackCorruptError, match="sha256"):
        read_pack(path)
    path.write_bytes(b"\x00\x01garbage")
    with pytest.raises(PackCorruptError, match="not a meancache pack"):
        read_pack(path)


def test_an_unknown_version_or_another_model_or_encoder_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.mcpack"
    write_pack(path, ENTRIES, model="m", sigma=1.0, encoder="enc-a")
    with pytest.raises(PackMismatchError, match="model 'm'"):
        read_pack(path, model="other")
    with pytest.raises(PackMismatchError, match="encoder 'enc-a'"):
        read_pack(path, encoder="enc-b")
    head, body = path.read_bytes().split(b"\n", 1)
    manifest = json.loads(head) | {"version": 99}
    path.write_bytes(json.dumps(manifest).encode() + b"\n" + body)
    with pytest.raises(PackVersionError, match="version 99"):
        read_pack(path)
