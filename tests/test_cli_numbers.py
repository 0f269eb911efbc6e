"""A number out of its option's range is refused in words naming the option, before any
model loads or anything is written (each of these once ran on: a negative --limit sliced
the pairs from the end, --explore 2 explored every hit, --default-max-tokens 0 raised a
traceback after the model had loaded)."""

import math
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st
from meancache.shared.arguments import count, real
from meancache.shared.verifier.training_commands import _run_settings
from meancache.shared.verifier.training_run import Run

from meancache.cli import build_parser, main

PAIRS = "pairs.jsonl"  # argparse refuses the number before the file is read


@pytest.mark.parametrize(("command", "said"), [
    (["cache", "list", "--limit", "-1"],
     "argument --limit: -1 is out of range (allowed: 0 or more)"),
    (["eval", "pairs", PAIRS, "--limit", "-1"], "argument --limit: -1 is out of range"),
    (["eval", "pairs", PAIRS, "--threshold", "2"], "argument --threshold: 2 is out of range "
     "(allowed: 0 to 1)"),
    (["eval", "pairs", PAIRS, "--sweep", "0", "2", "0.1"], "argument --sweep: 2 is out of range"),
    (["eval", "replay", PAIRS, "--limit", "0"], "argument --limit: 0 is out of range"),
    (["eval", "replay", PAIRS, "--learn", "--explore", "2"], "argument --explore: 2 is out"),
    (["pack", "update", "--max-mb", "-3"], "argument --max-mb: -3 is out of range (allowed: "
     "more than 0)"),
    (["upstream", "serve", "--max-body-kb", "-1"], "argument --max-body-kb: -1 is out"),
    (["upstream", "serve", "--max-queued", "0"], "argument --max-queued: 0 is out"),
    (["upstream", "background", "--idle-exit", "0"], "argument --idle-exit: 0 is out"),
    (["verifier", "train-teacher", "--batch", "0"], "argument --batch: 0 is out of range "
     "(allowed: 1 or more)"),
    (["verifier", "distil", "--learning-rate", "0"], "argument --learning-rate: 0 is out"),
    (["verifier", "train", "--seed", "-1"], "argument --seed: -1 is out of range"),
    (["verifier", "mine-pairs", "--out", "m.jsonl", "--per-question", "0"],
     "argument --per-question: 0 is out of range"),
    (["verifier", "mine-pairs", "--out", "m.jsonl", "--low", "2"], "argument --low: 2 is out"),
    (["verifier", "label-pairs", "--pairs", "p", "--out", "o", "--limit", "0"],
     "argument --limit: 0 is out of range"),
    (["verifier", "make-paraphrases", "--out", "p", "--temperature", "-1"],
     "argument --temperature: -1 is out of range"),
    # each of these two raised ZeroDivisionError once the data was read
    (["pack", "train-lm", "--data", PAIRS, "--out", "lm", "--batch-size", "0"],
     "argument --batch-size: 0 is out of range (allowed: 1 or more)"),
    (["pack", "train-lm", "--data", PAIRS, "--out", "lm", "--checkpoint-every", "0"],
     "argument --checkpoint-every: 0 is out of range"),
    (["pack", "train-lm", "--data", PAIRS, "--out", "lm", "--epochs", "0"],
     "argument --epochs: 0 is out of range"),  # saved an untrained model as trained
    (["pack", "train-lm", "--data", PAIRS, "--out", "lm", "--limit", "-1"],
     "argument --limit: -1 is out of range"),  # trained on all but the last instruction
    (["pack", "plan", "--data", PAIRS, "--lm", "lm", "--fit-sigmas", "5", "-3",
      "--hit-rate", "0.5"], "argument --fit-sigmas: -3 is out of range"),
    (["pack", "plan", "--data", PAIRS, "--lm", "lm", "--fit-sigmas", "1", "2",
      "--hit-rate", "2"], "argument --hit-rate: 2 is out of range (allowed: more than 0, "
     "at most 1)"),
    (["pack", "build", "--lm", "lm", "--packs-dir", "p", "--sigma", "0"],
     "argument --sigma: 0 is out of range"),
    (["pack", "build", "--lm", "lm", "--packs-dir", "p", "--sigma", "5", "--workers", "0"],
     "argument --workers: 0 is out of range"),
])
def test_an_option_out_of_range_is_refused_by_name_before_anything_runs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        command: list[str], said: str) -> None:
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "config"))
    with pytest.raises(SystemExit) as refused:
        main(["--data-dir", str(tmp_path / "data"), *command])
    assert refused.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert said in err and "Traceback" not in err
    assert not (tmp_path / "data").exists()


@pytest.mark.parametrize(("option", "value", "said"), [
    ("--default-max-tokens", "0", "--default-max-tokens must be at least 1"),
    ("--repetition-penalty", "-1", "--repetition-penalty must lie in (0, 2]"),
    ("--dry-allowed-length", "100", "--dry-allowed-length must lie in [1, 64]"),
])
def test_a_sampling_default_out_of_range_is_said_by_its_option_before_the_model_loads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        option: str, value: str, said: str) -> None:
    """The ranges are SamplingParams' (the one place that holds them)."""
    monkeypatch.setenv("MEANCACHE_CONFIG_DIR", str(tmp_path / "config"))
    assert main(["--data-dir", str(tmp_path / "data"), "upstream", "serve",
                 option, value]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"error: {said}" in err and "Traceback" not in err
    written = {p.relative_to(tmp_path / "data").as_posix()
               for p in (tmp_path / "data").rglob("*")}
    assert written <= {"logs", "logs/meancache.log"}  # no model was prepared


@given(st.integers(-10**6, 10**6), st.integers(-5, 5), st.one_of(st.none(), st.integers(0, 9)))
def test_a_count_is_accepted_exactly_within_its_range(number: int, minimum: int,
                                                      span: int | None) -> None:
    maximum = None if span is None else minimum + span
    inside = number >= minimum and (maximum is None or number <= maximum)
    parse = count(minimum, maximum)
    if inside:
        assert parse(str(number)) == number
    else:
        with pytest.raises(Exception, match="out of range"):
            parse(str(number))


@given(st.floats(allow_nan=True, allow_infinity=True), st.booleans())
@example(math.inf, True)  # above any lower bound, yet refused: not a finite number
def test_a_real_is_finite_and_above_its_bound(number: float, strict: bool) -> None:
    parse = real(above=0.0) if strict else real(0.0, 1.0)
    inside = math.isfinite(number) and ((number > 0.0) if strict else (0.0 <= number <= 1.0))
    if inside:
        assert parse(repr(number)) == number
    else:
        with pytest.raises(Exception, match="out of range|not a finite number"):
            parse(repr(number))


def test_a_training_runs_zeros_are_taken_where_they_mean_something() -> None:
    """--seed 0 is the default seed and --generated 0 trains without code-made negatives:
    both were refused as not positive when one check covered every run option."""
    args = build_parser().parse_args(["verifier", "train-teacher", "--seed", "0",
                                      "--generated", "0", "--checkpoint-minutes", "0"])
    overrides, options = _run_settings(args, Run(Path("new-run"), "teacher"))  # unread: new
    assert overrides == {"seed": 0, "generated": 0} and options.checkpoint_minutes == 0.0
