"""The benchmark's statistics: nearest-rank percentiles (what its tables report), medians and how sure
they are, latency columns."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of ``values`` (any order; ``q`` in 0..100); NaN for no values."""
    rank = max(1, math.ceil(q / 100 * len(values)))
    return float(sorted(values)[rank - 1]) if values else math.nan


def median(values: Sequence[float]) -> float:
    """The median; NaN for no values."""
    return statistics.median(values) if values else math.nan


def median_interval(values: Sequence[float]) -> tuple[float, float]:
    """About 95 % sure the true median lies between these two of ``values`` (the order statistics
    ``(n - 1.96 sqrt(n)) / 2`` from each end; the extremes for few values); NaN for no values."""
    ordered, n = sorted(values), len(values)
    k = max(0, math.floor((n - 1.96 * math.sqrt(n)) / 2))
    return (float(ordered[k]), float(ordered[-1 - k])) if values else (math.nan, math.nan)


def latency(values_ms: Sequence[float], prefix: str = "") -> dict[str, float]:
    """A summary row's latency columns, each name after ``prefix``: ``p25_ms`` .. ``p99_ms`` (nearest
    rank; p25-p75 is the spread the tables show), ``max_ms``, and ``ci_low_ms`` / ``ci_high_ms``: the
    median's :func:`median_interval`, what the verdict compares."""
    low, high = median_interval(values_ms)
    return {
        **{f"{prefix}p{q}_ms": percentile(values_ms, q) for q in (25, 50, 75, 95, 99)},
        f"{prefix}max_ms": max(values_ms, default=math.nan),
        f"{prefix}ci_low_ms": low,
        f"{prefix}ci_high_ms": high,
    }
