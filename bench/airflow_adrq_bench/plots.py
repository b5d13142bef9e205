"""The matplotlib set-up every report's PNG shares: a backend without a display, and saving a figure."""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["pyplot", "save"]


def pyplot() -> Any:
    """``matplotlib.pyplot`` on the Agg backend: the benchmarks run on servers and in CI, with no display.

    Imported here, not at module level: matplotlib is needed only to plot.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig: Any, title: str, path: Path, **savefig: Any) -> Path:
    """Give ``fig`` its title, lay it out, write it to ``path`` and free it; returns ``path``."""
    plt = pyplot()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, **savefig)
    plt.close(fig)
    return path
