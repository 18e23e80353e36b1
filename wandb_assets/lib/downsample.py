"""Downsampling a series for plotting without losing the points that matter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def downsample(points: Sequence[Any], limit: int, keep: set[int] | None = None) -> list[Any]:
    """At most ``limit`` points in their original order: always the last one and every index in ``keep``
    (alert points, say) while they fit, the remaining budget spread evenly over the rest."""
    n = len(points)
    if n <= limit:
        return list(points)
    must = sorted({n - 1} | {i for i in (keep or set()) if 0 <= i < n})
    if len(must) >= limit:
        return [points[i] for i in must[-limit:]]
    budget = limit - len(must)
    others = [i for i in range(n) if i not in set(must)]
    step = len(others) / budget
    chosen = {others[int(k * step)] for k in range(budget)}
    return [points[i] for i in sorted(chosen | set(must))]
