"""The teacher's labels committed by reference: packed with each text's sha256 in its place,
restored from the shared data to the very bytes label-pairs wrote (and a summary distil
accepts), and refused, with nothing written, where the data or the refs differ."""

import hashlib
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from meancache.shared.errors import VerifierError
from meancache.shared.verifier.distil import read_soft_pairs
from meancache.shared.verifier.label_refs import pack, restore, summary_path

from meancache.cli import main
from tests.support.fuzz import FUZZ_SEED, fuzzed
from tests.support.shared_data import write_data_root

QQP = [("How tall is Everest?", "How high is Everest?", 1, "train"),
       ("Is Pluto a planet?", "Is Pluto still a planet?", 1, "dev")]
ARENA = ["What's the capital city\u2028of France?", "Qu'est-ce que la photosynthèse ?",
         "How do I bake bread?"]
SHAREGPT = ["What is the capital of France?", "Explain photosynthesis simply. 🌱"]
CONTEXTUAL = [("Why is the sky blue?", "And why is it red at sunset?")]
UNIQUE = ["How do cats purr?"]
WEIGHTS = "ab" * 32


def _data(root: Path, arena: list[str] = ARENA, sharegpt: list[str] = SHAREGPT) -> Path:
    return write_data_root(root, QQP, arena, sharegpt, CONTEXTUAL, UNIQUE)


def _labels(path: Path, pairs: list[tuple[str, str]]) -> Path:
    """A labels file and its summary, written as label.py writes them."""
    rows = [{"q1": a, "q2": b, "cosine": round(0.8 + i / 1000, 6), "sources": ["arena", "x"],
             "split": ("train", "choose", "test")[i % 3], "teacher": round(i / 7 % 1, 6)}
            for i, (a, b) in enumerate(pairs)]
    data = "".join(json.dumps(r) + "\n" for r in rows)
    path.write_text(data)
    summary = {"pairs": len(rows), "teacher": {"run": "run", "epoch": 1,
                                               "weights_sha256": WEIGHTS, "bfloat16": False,
                                               "dev": {"dev-a": {"f05": 0.8}}},
               "labels_sha256": hashlib.sha256(data.encode()).hexdigest()}
    summary_path(path).write_text(json.dumps(summary, indent=2) + "\n")
    return path


PAIRS = [(ARENA[0], SHAREGPT[0]), (ARENA[1], SHAREGPT[1]), ("How tall is Everest?",
                                                             "How high is Everest?"),
         (CONTEXTUAL[0][0], UNIQUE[0]), (ARENA[2], CONTEXTUAL[0][1])]


@pytest.fixture
def packed(tmp_path: Path) -> tuple[Path, Path, Path]:
    root = _data(tmp_path / "data")
    labels = _labels(tmp_path / "labelled.jsonl", PAIRS)
    refs = tmp_path / "repo" / "mined.refs.jsonl"
    refs.parent.mkdir()
    pack(labels, refs, root)
    return root, labels, refs


def test_restored_labels_are_the_packed_bytes_and_distil_reads_them(
        packed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    root, labels, refs = packed
    committed = refs.read_text() + summary_path(refs).read_text()
    assert not any(text in committed or json.dumps(text)[1:-1] in committed
                   for pair in PAIRS for text in pair)  # no text of the data in the repo
    out = tmp_path / "restored" / "labels.jsonl"
    out.parent.mkdir()
    restore(refs, out, root)
    assert out.read_bytes() == labels.read_bytes()
    assert summary_path(out).read_bytes() == summary_path(labels).read_bytes()
    pairs, teacher = read_soft_pairs(out)
    assert teacher == WEIGHTS and [(p.q1, p.q2) for p in pairs] == PAIRS


def test_a_changed_text_in_the_data_is_refused_and_nothing_is_written(
        packed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, _, refs = packed
    other = _data(tmp_path / "other", arena=[ARENA[0], ARENA[1] + " ", ARENA[2]])
    out = tmp_path / "labels.jsonl"
    with pytest.raises(VerifierError, match=r"1 texts of .* are not among the question sets "
                       r"of .*other \(row 2 q1 \(sha256 [0-9a-f]{12}\.\.\.\)\).*another "
                       "version of the data"):
        restore(refs, out, other)
    assert not out.exists() and not summary_path(out).exists()


def test_refs_changed_after_packing_are_refused_by_the_labels_sha256(
        packed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    root, labels, refs = packed
    rows = [json.loads(line) for line in refs.read_text().splitlines()]
    rows[3]["teacher"] = 0.999
    refs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "labels.jsonl"
    sha = json.loads(summary_path(labels).read_text())["labels_sha256"]
    with pytest.raises(VerifierError, match=f"not the recorded {sha[:12]}.*nothing written"):
        restore(refs, out, root)
    assert not out.exists() and not summary_path(out).exists()


def test_pack_refuses_a_text_the_data_lacks_and_labels_not_as_label_pairs_wrote_them(
        tmp_path: Path) -> None:
    root = _data(tmp_path / "data")
    refs = tmp_path / "refs.jsonl"
    labels = _labels(tmp_path / "labelled.jsonl", [*PAIRS, ("Hand-written?", ARENA[0])])
    with pytest.raises(VerifierError, match=r"row 6 q1 .* could not be restored"):
        pack(labels, refs, root)
    labels = _labels(tmp_path / "labelled.jsonl", PAIRS)
    labels.write_text(labels.read_text().replace('", "', '","', 1))
    with pytest.raises(VerifierError, match="not written as .*label-pairs"):
        pack(labels, refs, root)
    labels = _labels(tmp_path / "labelled.jsonl", PAIRS)
    summary_path(labels).write_text(json.dumps({"teacher": {"weights_sha256": WEIGHTS},
                                                "labels_sha256": "0" * 64}))
    with pytest.raises(VerifierError, match="is not the label-pairs summary of"):
        pack(labels, refs, root)
    with pytest.raises(VerifierError, match="would overwrite"):
        pack(labels, labels.with_suffix(".jsonl"), root)
    assert not refs.exists() and not summary_path(refs).exists()


def test_the_commands_round_trip_and_refuse_without_a_traceback(
        packed: tuple[Path, Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    root, labels, refs = packed
    common = ["--data-dir", str(tmp_path / "home"), "--config-dir", str(tmp_path), "verifier"]
    out = tmp_path / "cli.jsonl"
    assert main([*common, "restore-labels", "--refs", str(refs), "--out", str(out),
                 "--data-root", str(root)]) == 0
    assert out.read_bytes() == labels.read_bytes()
    capsys.readouterr()
    other = _data(tmp_path / "other", sharegpt=["Something else entirely?"])
    code = main([*common, "restore-labels", "--refs", str(refs), "--out",
                 str(tmp_path / "none.jsonl"), "--data-root", str(other)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err and "another version of the data" in err
    assert not (tmp_path / "none.jsonl").exists()


TEXT = st.text(st.characters(codec="utf-8"), min_size=1, max_size=30).filter(
    lambda t: t.split())


@fuzzed(max_examples=40)
@given(texts=st.lists(TEXT, min_size=2, max_size=8,
                      unique_by=lambda t: " ".join(t.lower().split())),
       data=st.data())
def test_any_texts_round_trip_byte_for_byte(texts: list[str], data: st.DataObject) -> None:
    print(f"fuzz seed {FUZZ_SEED}")
    held = {" ".join(t.lower().split()) for row in QQP for t in row[:2]}
    assume(not held & {" ".join(t.lower().split()) for t in texts})
    pairs = data.draw(st.lists(st.tuples(st.sampled_from(texts), st.sampled_from(texts)),
                               min_size=1, max_size=10))
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        half = len(texts) // 2
        root = _data(tmp / "data", arena=texts[:half], sharegpt=texts[half:])
        labels = _labels(tmp / "labelled.jsonl", pairs)
        pack(labels, tmp / "refs.jsonl", root)
        restore(tmp / "refs.jsonl", tmp / "restored.jsonl", root)
        assert (tmp / "restored.jsonl").read_bytes() == labels.read_bytes()
