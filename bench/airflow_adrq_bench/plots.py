"""The matplotlib set-up every report's PNG shares: a backend without a display, grouped bars, saving."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = ["Series", "bars", "pyplot", "save"]

#: One series of grouped bars: its label, a value per group, and matplotlib's bar() keywords.
Series = tuple[str, Sequence[float], dict[str, Any]]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: the benchmarks run on servers and in CI, with no display.

    Imported here, not at module level: matplotlib is needed only to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars(
    ax: Any, groups: Sequence[str], series: Sequence[Series], values: str | None = None, **ticks: Any
) -> list[Any]:
    """One group of bars per ``groups`` label, one bar per series side by side; the bar containers.

    ``values``: a format (``"%g"``) to write each bar's value on it.
    """
    width = 0.8 / max(1, len(series))
    drawn = []
    for k, (label, heights, style) in enumerate(series):
        xs = [i + (k - (len(series) - 1) / 2) * width for i in range(len(groups))]
        drawn.append(ax.bar(xs, heights, width, label=label, **style))
        if values:
            ax.bar_label(drawn[-1], fmt=values, fontsize=7)
    ax.set_xticks(range(len(groups)), groups, **ticks)
    return drawn


def save(fig: Any, title: str, path: Path, **savefig: Any) -> Path:
    """Give ``fig`` its title, lay it out, write it to ``path`` and free it; returns ``path``."""
    plt = pyplot()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, **savefig)
    plt.close(fig)
    return path
