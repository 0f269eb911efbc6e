"""The benchmarks' pictures: a sweep drawn as a line chart and written as a PNG beside the
table (``--plot FILE``). matplotlib comes with the ``bench`` extra, never with the chat."""

from __future__ import annotations

import argparse
import sys
import textwrap
from collections.abc import Mapping, Sequence
from pathlib import Path

from meancache.shared.errors import MissingExtraError
from meancache.shared.extras import require

Series = Mapping[str, tuple[Sequence[float], Sequence[float]]]  # label: (xs, ys)


def _png_path(value: str) -> Path:
    """--plot's type: a .png path, and matplotlib installed (checked before the run)."""
    try:
        require("matplotlib", "bench", "--plot")
    except MissingExtraError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if not value.endswith(".png"):
        raise argparse.ArgumentTypeError(f"{value}: the picture is written as PNG; end the "
                                         "name in .png")
    return Path(value)


def add_plot_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--plot", type=_png_path, metavar="FILE.png",
                        help="also draw the sweep into this PNG (needs the bench extra: "
                        "pip install -e '.[bench]')")


def line_chart(path: Path, title: str, x_label: str, y_label: str, lines: Series, *,
               subtitle: str = "", log_x: bool = False, log_y: bool = False,
               points: Series | None = None, y_limits: tuple[float, float] | None = None,
               ) -> None:
    """Draw ``lines`` (and unconnected ``points``) with a legend, titled by what was
    measured (``title``) and on what (``subtitle``); the command that ran is the footnote."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    fig, ax = plt.subplots(figsize=(8, 5), dpi=120)
    for label, (xs, ys) in lines.items():
        ax.plot(xs, ys, marker="o", label=label)
    for label, (xs, ys) in (points or {}).items():
        ax.plot(xs, ys, linestyle="none", marker="s", markersize=7, label=label)
    ax.set(xlabel=x_label, ylabel=y_label)
    plain = FuncFormatter(lambda value, _: f"{value:,.10g}")  # 2,048 and 0.5, not 2x10^3
    if log_x:
        ax.set_xscale("log")
        xs = sorted({x for xs, _ in lines.values() for x in xs})
        if len(xs) <= 10:
            ax.set_xticks(xs)  # the values swept, as they were asked for
        ax.xaxis.set_major_formatter(plain)
        ax.xaxis.set_minor_formatter(NullFormatter())
    if log_y:
        ax.set_yscale("log")
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        ax.yaxis.set_major_formatter(plain)
        ax.yaxis.set_minor_formatter(NullFormatter())
    if y_limits is not None:
        ax.set_ylim(*y_limits)
    ax.grid(True, which="major", alpha=0.3)
    ax.legend()
    fig.suptitle(title, fontsize=12)
    if subtitle:
        ax.set_title(textwrap.fill(subtitle, 105), fontsize=9, color="dimgray")
    command = textwrap.wrap("python " + " ".join(sys.argv), 125)
    fig.text(0.01, 0.01, "\n".join(command), fontsize=7, color="gray")
    fig.tight_layout(rect=(0, 0.03 * len(command), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    print(f"picture: {path}", file=sys.stderr)
