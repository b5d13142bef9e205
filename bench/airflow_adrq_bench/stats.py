"""The benchmark's statistics: nearest-rank percentiles (what its tables report), medians, latency columns."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

__all__ = ["latency", "median", "percentile"]


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (any order; ``q`` in 0..100); NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return float(ordered[rank - 1])


def median(values: Sequence[float]) -> float:
    """The median; NaN for no values."""
    return statistics.median(values) if values else math.nan


def latency(values_ms: Sequence[float], prefix: str = "") -> dict[str, float]:
    """A summary row's latency columns: ``p25_ms`` .. ``p99_ms`` (nearest rank; p25 and p75 are the
    spread the verdict compares) and ``max_ms``, each name after ``prefix``."""
    return {
        **{f"{prefix}p{q}_ms": percentile(values_ms, q) for q in (25, 50, 75, 95, 99)},
        f"{prefix}max_ms": max(values_ms, default=math.nan),
    }
