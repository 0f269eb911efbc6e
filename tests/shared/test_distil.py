"""The student's distillation on tiny random-init backbones: it learns the teacher's
probabilities on the labels files' train splits only (a judged paraphrase file's kept pairs
only), a run stopped and resumed is at the very state of one that never stopped, its
card's threshold is the F0.5 optimum on QQP dev-a with the choose splits, and labels of an
unknown teacher, of two teachers, or changed under a resumed run are refused."""

import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from meancache.shared.errors import VerifierError
from meancache.shared.files import sha256_file
from meancache.shared.pairs import read_pairs
from meancache.shared.threshold import best_threshold
from meancache.shared.verifier.distil import SAME, StudentConfig, distil
from meancache.shared.verifier.label import label_pairs
from meancache.shared.verifier.runtime import LearnedVerifier
from meancache.shared.verifier.teacher import TeacherConfig, train_teacher
from meancache.shared.verifier.train import dev_half
from meancache.shared.verifier.training_run import EXAMPLES_FILE, RunOptions

from tests.support.cross_encoders import (
    SUBJECTS,
    assert_same_state,
    checkpoint_state,
    keep_torch_threads,  # noqa: F401 (autouse)
    qqp_shaped_pairs,
    tiny_backbone,
)

CONFIG = StudentConfig(pairs=12, generated=4, epochs=2, batch=4, max_tokens=24,
                       dev_pairs=12, seed=5)
SPLITS = ("train", "choose", "test")


@pytest.fixture(scope="module")
def inputs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """QQP-shaped pairs, a student backbone, and two labels files from one tiny teacher:
    mined pairs labelled by ``label-pairs``, and a judged paraphrase file."""
    root = tmp_path_factory.mktemp("distil")
    data, teacher_backbone = qqp_shaped_pairs(root), tiny_backbone(root, "mpnet")
    threads = torch.get_num_threads()
    train_teacher(root / "teacher", data, teacher_backbone,
                  TeacherConfig(pairs=12, generated=4, epochs=1, batch=4, max_tokens=24,
                                dev_pairs=12), RunOptions())
    torch.set_num_threads(threads)
    mined = root / "mined.jsonl"
    mined.write_text("".join(
        json.dumps({"q1": f"Is {s} big?", "q2": f"How big is {o}?", "split": SPLITS[i % 3]})
        + "\n" for i, (s, o) in enumerate(zip(SUBJECTS, SUBJECTS[3:] + SUBJECTS[:3],
                                              strict=True))))
    labelled = root / "labelled.jsonl"
    summary = label_pairs(root / "teacher", teacher_backbone, mined, labelled)
    judged = root / "para.judged.jsonl"
    judged.write_text("".join(json.dumps(
        {"source": f"Tell me about {s}", "paraphrase": f"What do you know of {s}?",
         "split": SPLITS[i % 3], "teacher": round(0.3 + 0.05 * i, 6), "kept": i % 2 == 0})
        + "\n" for i, s in enumerate(SUBJECTS)))
    judged.with_suffix(".json").write_text(json.dumps(
        {"teacher": {"weights_sha256": summary["teacher"]["weights_sha256"]}}))
    return {"root": root, "data": data, "student": tiny_backbone(root, "bert"),
            "labelled": labelled, "judged": judged}


def _distil(inputs: dict[str, Path], name: str, resume: bool = False,
            stop_after: int | None = None, labels: list[Path] | None = None) -> dict:
    root = inputs["root"]
    return distil(root / name, inputs["data"],
                  [inputs["labelled"], inputs["judged"]] if labels is None else labels,
                  inputs["student"], root / f"{name}-artefact", CONFIG,
                  RunOptions(stop_after=stop_after), resume=resume)


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def test_the_student_learns_the_teachers_probabilities_on_train_splits_only(
        inputs: dict[str, Path]) -> None:
    record = _distil(inputs, "examples", stop_after=1)
    examples = {(r["q1"], r["q2"]): r["label"]
                for r in _rows(inputs["root"] / "examples" / EXAMPLES_FILE)}
    mined = _rows(inputs["labelled"])
    judged = _rows(inputs["judged"])
    for row in mined:
        assert examples.get((row["q1"], row["q2"])) == (
            row["teacher"] if row["split"] == "train" else None)
    for row in judged:
        assert examples.get((row["source"], row["paraphrase"])) == (
            row["teacher"] if row["split"] == "train" and row["kept"] else None)
    taught = sum(r["split"] == "train" for r in mined) \
        + sum(r["split"] == "train" and r["kept"] for r in judged)
    assert record["examples"]["kinds"]["teacher-labelled pairs (soft)"] == taught
    qqp = read_pairs(inputs["data"], split="train")
    drawn = [p for p in qqp if (p.q1, p.q2) in examples]
    assert len(drawn) == CONFIG.pairs  # QQP's draw, with its gold labels
    assert all(examples[(p.q1, p.q2)] == p.label for p in drawn)


def test_a_stopped_run_resumes_as_one_that_never_stopped_and_exports_its_card(
        inputs: dict[str, Path]) -> None:
    assert _distil(inputs, "whole", stop_after=6)["finished"] is False
    _distil(inputs, "stopped", stop_after=3)
    _distil(inputs, "stopped", resume=True, stop_after=3, labels=[])  # the run's own
    assert_same_state(checkpoint_state(inputs["root"] / "whole", "student.json"),
                      checkpoint_state(inputs["root"] / "stopped", "student.json"))
    whole = _distil(inputs, "whole", resume=True)  # to the end: exported (slow: once)
    assert whole["finished"] and whole["card"]["sha256"] == sha256_file(
        inputs["root"] / "whole-artefact" / "verifier.onnx")
    card = json.loads((inputs["root"] / "whole-artefact" / "verifier.json").read_text())
    assert card["command"] == "meancache verifier distil"
    assert [entry["sha256"] for entry in card["labels"]] == [
        e["sha256"] for e in whole["data"]["labels"]]
    assert card["teacher_weights_sha256"] == json.loads(
        inputs["labelled"].with_suffix(".json").read_text())["teacher"]["weights_sha256"]

    # The threshold: F0.5's optimum on dev-a with both choose splits, as the shipped
    # verifier scores them; dev-b and the test splits are only reported.
    verifier = LearnedVerifier.load(inputs["root"] / "whole-artefact")
    dev = read_pairs(inputs["data"], split="dev")
    dev = random.Random(CONFIG.seed).sample(dev, min(CONFIG.dev_pairs, len(dev)))
    tune = [(p.q1, p.q2, bool(p.label)) for p in dev if dev_half(p) == "dev-a"]
    tune += [(r["q1"], r["q2"], r["teacher"] >= SAME) for r in _rows(inputs["labelled"])
             if r["split"] == "choose"]
    tune += [(r["source"], r["paraphrase"], r["teacher"] >= SAME)
             for r in _rows(inputs["judged"]) if r["split"] == "choose" and r["kept"]]
    probs = verifier.pair_probabilities([a for a, _, _ in tune], [b for _, b, _ in tune])
    expected = best_threshold(probs, np.array([y for _, _, y in tune])).threshold
    assert card["threshold"] == round(float(expected), 6)
    assert "qqp dev-b" in card["dev"] and "labels 1 test" in card["dev"]
    assert "dev-b" not in card["threshold_chosen_on"] and "test" not in \
        card["threshold_chosen_on"]


def test_labels_of_an_unknown_teacher_or_of_two_or_changed_are_refused(
        inputs: dict[str, Path], tmp_path: Path) -> None:
    unnamed = tmp_path / "unnamed.jsonl"
    unnamed.write_text(inputs["labelled"].read_text())
    with pytest.raises(VerifierError, match="does not name the teacher weights"):
        _distil(inputs, "unnamed", labels=[unnamed])
    other = tmp_path / "other.jsonl"
    other.write_text(inputs["labelled"].read_text())
    other.with_suffix(".json").write_text(json.dumps({"teacher": {"weights_sha256": "f" * 64}}))
    with pytest.raises(VerifierError, match="come from 2 teachers"):
        _distil(inputs, "two", labels=[inputs["labelled"], other])
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"q1": "a?", "q2": "b?", "split": "train", "teacher": 1.5})
                   + "\n")
    bad.with_suffix(".json").write_text(other.with_suffix(".json").read_text())
    with pytest.raises(VerifierError, match="row 1 has no teacher probability"):
        _distil(inputs, "bad", labels=[bad])
    changed = tmp_path / "changed.jsonl"
    changed.write_text(inputs["labelled"].read_text())
    changed.with_suffix(".json").write_text(inputs["labelled"].with_suffix(".json").read_text())
    _distil(inputs, "changing", stop_after=1, labels=[changed])
    rows = _rows(changed)
    rows[0]["teacher"] = 1.0 - rows[0]["teacher"]
    changed.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(VerifierError, match="not the file this run was trained on"):
        _distil(inputs, "changing", resume=True, labels=[changed])
