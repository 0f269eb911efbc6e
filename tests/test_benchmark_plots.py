"""The benchmarks' --plot: a PNG of the sweep, and a one-line refusal (before any work)
when the picture cannot be drawn."""

import argparse
import importlib.util
import sys
from pathlib import Path

import pytest

from tests.support.paths import REPO

sys.path.insert(0, str(REPO / "benchmarks"))
from _plot import add_plot_option, line_chart  # noqa: E402


def parser() -> argparse.ArgumentParser:
    made = argparse.ArgumentParser(prog="bench")
    add_plot_option(made)
    return made


def test_a_sweep_is_drawn_into_a_png(tmp_path: Path) -> None:
    path = tmp_path / "docs" / "sweep.png"
    args = parser().parse_args(["--plot", str(path)])
    line_chart(args.plot, "TTFT against prompt length", "tokens", "ms",
               {"full": ([512, 1024], [80.0, 170.0]), "cached": ([512, 1024], [9.0, 9.5])},
               subtitle="tiny model", log_x=True, points={"measured": ([700], [50.0])})
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert path.stat().st_size > 10_000  # axes, lines and text, not an empty canvas


@pytest.mark.parametrize("value, message", [
    ("chart.jpg", "end the name in .png"),
    ("chart.png", "pip install -e '.[bench]'"),
])
def test_plot_is_refused_in_one_line(value: str, message: str, monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    if value.endswith(".png"):  # as on the chat's install, which has no matplotlib
        find_spec = importlib.util.find_spec
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None
                            if name == "matplotlib" else find_spec(name, *a))
    with pytest.raises(SystemExit):
        parser().parse_args(["--plot", value])
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("bench: error: argument --plot") and message in error
