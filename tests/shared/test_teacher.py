"""The teacher's run mechanics on tiny random-init backbones (BERT-style with segment ids,
MPNet-style without, and a Gemma 3-style decoder, the packaged LM read as a pair
classifier): a run stopped, even killed, and resumed ends with the weights of one
that never stopped; its record names the seed, config and data hashes; a checkpoint that
is damaged, missing or half-written is never loaded; its labels name the weights they
came from, and labelling killed and resumed writes the labels of a run that never stopped."""

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from filelock import FileLock
from meancache.shared.errors import CheckpointError, VerifierError
from meancache.shared.files import sha256_file
from meancache.shared.verifier.label import label_pairs, progress_paths
from meancache.shared.verifier.teacher import (
    EXAMPLES_FILE,
    LOG_FILE,
    RECORD_FILE,
    RunOptions,
    TeacherConfig,
    load_provisional,
    load_teacher,
    pair_probabilities,
    train_teacher,
)

from meancache.cli import main
from tests.support.cross_encoders import (
    SUBJECTS,
    assert_same_state,
    checkpoint_state,
    keep_torch_threads,  # noqa: F401 (autouse)
    qqp_shaped_pairs,
    tiny_backbone,
)
from tests.support.paths import REPO

# Tiny sizes: 2 epochs of about 5 steps of 4 pairs (12 QQP-style pairs, some code-made).
CONFIG = TeacherConfig(pairs=12, generated=4, epochs=2, batch=4, max_tokens=24,
                       dev_pairs=12, seed=3)


@pytest.fixture(scope="module", params=["bert", "mpnet", "gemma"])
def setup(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
          ) -> tuple[Path, Path, Path]:
    """The pairs file, a backbone, and a run of all 12 steps that never stopped."""
    root = tmp_path_factory.mktemp(f"teacher-{request.param}")
    data, backbone = qqp_shaped_pairs(root), tiny_backbone(root, request.param)
    threads = torch.get_num_threads()
    train_teacher(root / "whole", data, backbone, CONFIG, RunOptions(log_every=2))
    torch.set_num_threads(threads)
    return data, backbone, root / "whole"


def test_a_run_stopped_and_resumed_ends_with_the_weights_of_one_that_never_stopped(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    data, backbone, whole = setup
    steps = json.loads((whole / RECORD_FILE).read_text())["steps"]
    stops = random.Random().sample(range(1, steps), 2)  # any step, an epoch's end included
    print(f"stopped after {sorted(stops)} steps")
    out = tmp_path / "parts"
    first = train_teacher(out, data, backbone, CONFIG, RunOptions(stop_after=min(stops)))
    assert first["checkpoint"]["step"] == min(stops) and not first["finished"]
    train_teacher(out, data, backbone, CONFIG,
                  RunOptions(stop_after=max(stops) - min(stops) or 1), resume=True)
    record = train_teacher(out, data, backbone, CONFIG, RunOptions(), resume=True)
    assert record["finished"] and record["checkpoint"]["step"] == steps
    assert_same_state(checkpoint_state(out, RECORD_FILE),
                      checkpoint_state(whole, RECORD_FILE))
    expected = json.loads((whole / RECORD_FILE).read_text())["epochs"]
    assert [e["epoch"] for e in record["epochs"]] == [1, 2]
    for got, want in zip(record["epochs"], expected, strict=True):
        assert got["dev"] == want["dev"] and got["weights_sha256"] == want["weights_sha256"]
    assert list(out.glob("checkpoint-*.pt")) == [out / f"checkpoint-{steps:07d}.pt"]
    assert "resumed at step" in (out / LOG_FILE).read_text()
    assert [i["from_step"] for i in record["invocations"]] == [0, *sorted(stops)]
    assert record["invocations"][0]["stop_after"] == min(stops)


@pytest.mark.slow(40)
@pytest.mark.parametrize("setup", ["bert"], indirect=True)
def test_a_killed_run_resumes_from_its_last_whole_checkpoint(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """The CLI killed (SIGKILL) mid-run, at whatever it was writing, then --resume. On one
    backbone: what a kill can cut is the writing of the record and checkpoints, the same
    for both (the stop and resume above runs on both)."""
    data, backbone, whole = setup
    out = tmp_path / "killed"
    command = [sys.executable, "-m", "meancache", "--data-dir", str(tmp_path / "home"),
               "verifier", "train-teacher", "--out", str(out), "--data", str(data),
               "--backbone", str(backbone), "--checkpoint-minutes", "0"]
    sizes = ["--pairs", "12", "--generated", "4", "--epochs", "2", "--batch", "4",
             "--max-tokens", "24", "--dev-pairs", "12", "--seed", "3"]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1"}
    run = subprocess.Popen([*command, *sizes], cwd=REPO, env=environment,
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    target = random.Random().randint(1, 8)
    print(f"killed once the record names step {target} or later")
    deadline = time.monotonic() + 120
    while run.poll() is None and time.monotonic() < deadline:
        try:
            checkpoint = json.loads((out / RECORD_FILE).read_text())["checkpoint"]
        except (OSError, ValueError):
            checkpoint = None
        if checkpoint is not None and checkpoint["step"] >= target:
            run.send_signal(signal.SIGKILL)
            break
        time.sleep(0.005)
    run.wait(timeout=60)
    assert run.returncode == -signal.SIGKILL, run.stderr.read().decode()[-2000:]
    resumed = subprocess.run([*command, "--resume"], cwd=REPO, env=environment,
                             capture_output=True, text=True, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert not list(out.glob(".*.partial"))
    assert_same_state(checkpoint_state(out, RECORD_FILE),
                      checkpoint_state(whole, RECORD_FILE))


def test_the_record_names_the_seed_the_config_and_the_data_hashes(
        setup: tuple[Path, Path, Path]) -> None:
    data, backbone, whole = setup
    record = json.loads((whole / RECORD_FILE).read_text())
    assert record["seed"] == CONFIG.seed and record["config"] == asdict(CONFIG)
    assert record["data"]["qqp"]["sha256"] == sha256_file(data)
    assert record["data"]["qqp"]["train_rows"] == 24 and record["data"]["qqp"]["dev_rows"] == 12
    assert record["examples"]["sha256"] == sha256_file(whole / EXAMPLES_FILE)
    kinds = record["examples"]["kinds"]
    assert kinds["qqp train pairs"] == 12 and kinds["generated negatives"] <= 4
    assert record["examples"]["count"] == sum(v for k, v in kinds.items()
                                              if not k.startswith(" "))
    assert record["backbone"]["config_sha256"] == sha256_file(backbone / "config.json")
    assert record["steps"] == 2 * -(-record["examples"]["count"] // CONFIG.batch)
    for epoch in record["epochs"]:
        assert epoch["weights_sha256"] == sha256_file(whole / epoch["weights"])
        for half in ("dev-a", "dev-b"):
            assert 0.0 <= epoch["dev"][half]["auc"] <= 1.0
        assert epoch["dev"]["dev-a"]["pairs"] + epoch["dev"]["dev-b"]["pairs"] == 12
    log = (whole / LOG_FILE).read_text()
    assert "examples/s" in log and "ETA" in log and "epoch 2: dev-a AUC" in log
    assert "drawing the examples" in log and "finished; epoch" in log  # train, teacher


def _stopped_run(setup: tuple[Path, Path, Path], out: Path) -> dict:
    data, backbone, _ = setup
    return train_teacher(out, data, backbone, CONFIG, RunOptions(stop_after=3))


def test_a_damaged_or_missing_checkpoint_is_never_loaded(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    data, backbone, _ = setup
    out = tmp_path / "run"
    record = _stopped_run(setup, out)
    checkpoint = out / record["checkpoint"]["file"]
    damaged = bytearray(checkpoint.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    checkpoint.write_bytes(bytes(damaged))
    with pytest.raises(CheckpointError, match="is damaged .* it is not loaded"):
        train_teacher(out, data, backbone, CONFIG, RunOptions(), resume=True)
    checkpoint.unlink()
    with pytest.raises(CheckpointError, match="named in teacher.json is missing"):
        train_teacher(out, data, backbone, CONFIG, RunOptions(), resume=True)


def test_a_provisional_teacher_is_a_checkpoints_weights_named_by_its_hash(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """Before any epoch has finished, `make-paraphrases --judge --checkpoint` labels with
    the weights of a training checkpoint; a damaged or foreign file is refused."""
    _, backbone, _ = setup
    out = tmp_path / "run"
    record = _stopped_run(setup, out)
    checkpoint = out / record["checkpoint"]["file"]
    with pytest.raises(VerifierError, match="has not finished an epoch"):
        load_teacher(out, backbone)
    model, _, entry = load_provisional(out, backbone, checkpoint)
    assert entry == {"checkpoint": checkpoint.name, "sha256": sha256_file(checkpoint),
                     "step": 3, "steps": record["steps"], "provisional": True}
    saved = torch.load(checkpoint, weights_only=True)["model"]
    for name, value in model.state_dict().items():
        assert torch.equal(value, saved[name]), name
    probs = pair_probabilities(model, ["How tall is Everest?"], ["How high is Everest?"],
                               CONFIG.max_tokens, backbone / "tokenizer.json", False)
    assert 0.0 <= probs[0] <= 1.0
    damaged = tmp_path / "damaged.pt"
    damaged.write_bytes(checkpoint.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        load_provisional(out, backbone, damaged)
    with pytest.raises(CheckpointError, match="cannot be loaded"):
        load_provisional(out, backbone, tmp_path / "missing.pt")


def test_a_half_written_checkpoint_is_ignored_and_removed(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    """What a kill mid-write leaves: a partial file under a name the record never holds."""
    data, backbone, _ = setup
    out = tmp_path / "run"
    record = _stopped_run(setup, out)
    partial = out / ".checkpoint-0000004.pt.1234-5678.partial"
    partial.write_bytes((out / record["checkpoint"]["file"]).read_bytes()[:1000])
    resumed = train_teacher(out, data, backbone, CONFIG, RunOptions(stop_after=1),
                            resume=True)
    assert resumed["checkpoint"]["step"] == 4 and not partial.exists()


def test_a_run_is_neither_started_over_nor_resumed_from_nothing_or_other_data(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    data, backbone, _ = setup
    with pytest.raises(VerifierError, match="holds no teacher run to resume"):
        train_teacher(tmp_path / "empty", data, backbone, CONFIG, RunOptions(), resume=True)
    out = tmp_path / "run"
    _stopped_run(setup, out)
    with pytest.raises(VerifierError, match="already holds a teacher run"):
        train_teacher(out, data, backbone, CONFIG, RunOptions())
    with FileLock(out / ".teacher.lock"), pytest.raises(
            VerifierError, match="another process is training the teacher"):
        train_teacher(out, data, backbone, CONFIG, RunOptions(), resume=True)
    other = tmp_path / "other.jsonl"
    other.write_text(data.read_text() + data.read_text().splitlines()[0] + "\n")
    with pytest.raises(VerifierError, match="is not the file this run was trained on"):
        train_teacher(out, other, backbone, CONFIG, RunOptions(), resume=True)


def test_the_cli_resumes_with_the_starting_settings_and_refuses_new_ones(
        setup: tuple[Path, Path, Path], tmp_path: Path,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The command that started a run, with --resume added, continues it; a setting that
    differs from the recorded one is refused, naming both, and the run is left as it was."""
    data, backbone, whole = setup
    out = tmp_path / "run"
    _stopped_run(setup, out)
    started = ["--data-dir", str(tmp_path), "verifier", "train-teacher", "--out", str(out),
               "--data", str(data), "--backbone", str(backbone), "--pairs", "12",
               "--generated", "4", "--epochs", "2", "--batch", "4", "--max-tokens", "24",
               "--dev-pairs", "12", "--seed", "3", "--threads", "1", "--resume"]
    record_before = (out / RECORD_FILE).read_bytes()
    assert main([*started, "--epochs", "3"]) == 2
    assert ("keeps the settings it started with: --epochs 3 (the run has 2)"
            in capsys.readouterr().err)
    assert (out / RECORD_FILE).read_bytes() == record_before
    assert main(started) == 0
    assert_same_state(checkpoint_state(out, RECORD_FILE), checkpoint_state(whole, RECORD_FILE))


BROKEN = '{"q1": "What is DNS?", "q2": "What does DNS do?", "label": 1}\n{"q1": "x"}\n'


@pytest.mark.parametrize(("command", "refusal"), [
    (["label-pairs", "--pairs", "{broken}", "--out", "{tmp}/out.jsonl"],
     "{broken}:2: not a JSON object with non-empty string 'q1' and 'q2'"),
    (["label-pairs", "--pairs", "{good}", "--run", "{tmp}/none", "--out", "{tmp}/out.jsonl"],
     "{tmp}/none holds no teacher run"),
    (["train-teacher", "--data", "{broken}", "--out", "{tmp}/run"],
     "{broken}:2: 'q2' must be a non-empty string"),
    (["train-teacher", "--resume", "--out", "{tmp}/run"],
     "{tmp}/run holds no teacher run to resume"),
    (["mine-pairs", "--data-root", "{tmp}", "--out", "{tmp}/mined.jsonl"],
     "cannot read {tmp}/qqp/pairs.jsonl: No such file or directory"),
], ids=["label-pairs", "label-pairs-no-run", "train-teacher", "train-teacher-resume",
        "mine-pairs"])
def test_a_broken_input_is_named_before_the_backbone_is_assembled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str],
        refusal: str) -> None:
    """MPNet's assembly (5 s and 438 MB written) waited in front of a one-line refusal."""
    broken, good = tmp_path / "pairs.jsonl", tmp_path / "good.jsonl"
    broken.write_text(BROKEN)
    good.write_text(BROKEN.split("\n")[0] + "\n")
    fill = {"broken": broken, "good": good, "tmp": tmp_path}
    code = main(["--data-dir", str(tmp_path / "data"), "verifier",
                 *(part.format(**fill) for part in command)])
    assert code == 2
    assert refusal.format(**fill) in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "data" / "models").exists()


@pytest.mark.parametrize("command", [
    ["train-teacher", "--out", "{tmp}/run"],
    ["distil", "--out", "{tmp}/student"],
    ["label-pairs", "--pairs", "{good}", "--out", "{tmp}/out.jsonl"],
], ids=["train-teacher", "distil", "label-pairs"])
def test_device_cuda_without_a_gpu_is_refused_before_any_work(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
        command: list[str]) -> None:
    """Where torch sees no GPU (every CPU build; forced here so that a CUDA machine runs
    the same test), --device cuda is one line, not a traceback after MPNet's assembly."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    good = tmp_path / "good.jsonl"
    good.write_text(BROKEN.split("\n")[0] + "\n")
    code = main(["--data-dir", str(tmp_path / "data"), "verifier",
                 *(part.format(good=good, tmp=tmp_path) for part in command),
                 "--device", "cuda"])
    assert code == 2
    assert f"--device cuda: this torch ({torch.__version__}) sees no CUDA GPU" \
        in " ".join(capsys.readouterr().err.split())
    assert not (tmp_path / "data" / "models").exists()
    assert not (tmp_path / "run").exists() and not (tmp_path / "student").exists()


def test_the_teachers_labels_are_its_probabilities_under_named_weights(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, backbone, whole = setup
    rows = [{"q1": "What is the capital of France?", "q2": "Which city is France's capital?",
             "split": "test", "cosine": 0.9},
            {"q1": "Why do cats\u2028purr?", "q2": "Why do dogs bark?", "split": "train"}]
    pairs = tmp_path / "mined.jsonl"
    pairs.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    out = tmp_path / "labelled.jsonl"
    summary = label_pairs(whole, backbone, pairs, out, epoch=1)
    labelled = [json.loads(line) for line in out.read_text().split("\n") if line]
    assert [{k: v for k, v in r.items() if k != "teacher"} for r in labelled] == rows
    model, record, entry = load_teacher(whole, backbone, epoch=1)
    direct = pair_probabilities(model, [r["q1"] for r in rows], [r["q2"] for r in rows],
                                CONFIG.max_tokens, backbone / "tokenizer.json",
                                summary["teacher"]["bfloat16"])
    assert [r["teacher"] for r in labelled] == [round(float(p), 6) for p in direct]
    assert all(0.0 < r["teacher"] < 1.0 for r in labelled)
    assert summary["teacher"]["weights_sha256"] == sha256_file(whole / "epoch-1.pt")
    assert summary["labels_sha256"] == sha256_file(out)
    assert load_teacher(whole, backbone)[2]["epoch"] == record["chosen_epoch"]
    with pytest.raises(VerifierError, match="has no epoch 7"):
        load_teacher(whole, backbone, epoch=7)
    damaged = tmp_path / "damaged"
    shutil.copytree(whole, damaged)
    (damaged / "epoch-1.pt").write_bytes((damaged / "epoch-1.pt").read_bytes()[:-1])
    with pytest.raises(CheckpointError, match="not the ones teacher.json names"):
        load_teacher(damaged, backbone, epoch=1)
    pairs.write_text('{"q1": "only one"}\n')
    with pytest.raises(VerifierError, match="mined.jsonl:1: not a JSON object"):
        label_pairs(whole, backbone, pairs, out)


class Killed(KeyboardInterrupt):
    """What a kill looks like to the labelling: it stops, nothing after runs."""


def test_labelling_killed_and_resumed_writes_the_labels_of_a_run_that_never_stopped(
        setup: tuple[Path, Path, Path], tmp_path: Path) -> None:
    _, backbone, whole = setup
    rows = [{"q1": f"What is the capital of {s}?", "q2": f"Which city is {o}'s capital?",
             "split": "train", "sources": ["qqp-train", "arena" if o == s else "qqp-train"]}
            for s in SUBJECTS for o in SUBJECTS[:2]]
    pairs = tmp_path / "mined.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    straight = label_pairs(whole, backbone, pairs, tmp_path / "straight.jsonl", epoch=1,
                           chunk=5)
    out = tmp_path / "parts.jsonl"
    kill_at = random.randrange(2, len(rows) // 5 + 1)  # progress is told after each chunk
    print(f"killed after {kill_at - 1} chunks")
    calls = []

    def dying(done: int, total: int) -> None:
        calls.append(done)
        if len(calls) == kill_at:
            raise Killed

    with pytest.raises(Killed):
        label_pairs(whole, backbone, pairs, out, epoch=1, progress=dying, chunk=5)
    assert not out.exists()
    labels, _ = progress_paths(out)
    with labels.open("a") as fh:
        fh.write('{"q1": "cut short by a kill", "te')  # an append the kill cut short
    done = 5 * (kill_at - 1)
    # whole chunks, as a run that never stopped cuts them (a batch's padding is the same)
    limited = label_pairs(whole, backbone, pairs, out, epoch=1, chunk=5, limit=10)
    assert limited["pairs"] == 10 and limited["reused"] == min(10, done)
    again = label_pairs(whole, backbone, pairs, out, epoch=1, chunk=5)
    assert again["reused"] == max(10, done)
    assert out.read_bytes() == (tmp_path / "straight.jsonl").read_bytes()
    assert again["histogram"] == straight["histogram"] and sum(again["histogram"]) == len(rows)
    assert {k: v["pairs"] for k, v in again["by_sources"].items()} == {
        "qqp-train + qqp-train": len(rows) - 2, "arena + qqp-train": 2}
    assert len(labels.read_text().splitlines()) == len(rows)  # each pair labelled once
    other = json.loads(progress_paths(out)[1].read_text()) | {"weights_sha256": "0" * 64}
    progress_paths(out)[1].write_text(json.dumps(other))
    with pytest.raises(VerifierError, match="came from other teacher weights"):
        label_pairs(whole, backbone, pairs, out, epoch=1)
