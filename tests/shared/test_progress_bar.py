"""Progress off a terminal: plain lines on stderr (a job under nohup, a service or a pipe
is followed in its output), at most one per interval, and always the last step."""

import io

from meancache.shared.progress_bar import ProgressBar
from rich.console import Console


def lines_of(steps: list[tuple[int, int]], line_every: float) -> list[str]:
    out = io.StringIO()
    with ProgressBar("search depth", Console(file=out, force_terminal=False, width=200),
                     line_every) as bar:
        for done, total in steps:
            bar(done, total)
    return out.getvalue().splitlines()


def test_off_a_terminal_each_step_is_a_line_with_its_share() -> None:
    lines = lines_of([(1, 4), (2, 4), (4, 4)], line_every=0)
    assert [line.split(",")[0] for line in lines] == [
        "search depth: 1/4 (25%)", "search depth: 2/4 (50%)", "search depth: 4/4 (100%)"]
    assert all(line.endswith(" s") for line in lines)


def test_lines_are_spaced_but_the_end_is_always_said() -> None:
    lines = lines_of([(n, 1000) for n in range(1, 1001)], line_every=3600)
    assert [line.split(",")[0] for line in lines] == [
        "search depth: 1/1000 (0%)", "search depth: 1000/1000 (100%)"]


def test_an_unknown_total_is_a_question_mark() -> None:
    assert lines_of([(3, 0)], line_every=0)[0].startswith("search depth: 3/?, ")
