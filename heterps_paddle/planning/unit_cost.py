"""What a million samples cost: the one definition (docs/metrics.md), for every plan and every figure, predicted or
measured.  Pure Python."""

from __future__ import annotations

import math


def cost_per_million_samples(cost_per_hour: float, samples_per_second: float) -> float:
    """What a million samples cost at ``cost_per_hour`` while the plan trains ``samples_per_second``: the one
    definition of cost per million samples (docs/metrics.md), for every plan and every figure, predicted (a plan's
    predicted samples/s, whether it was provisioned to a target or fitted to a launch) or measured (a running job's
    samples/s, launch/gauge.py)."""
    return cost_per_hour / (3600.0 * samples_per_second) * 1e6 if samples_per_second > 0 else math.inf


def cost_per_million_of(cost: float | None, samples: int | None) -> float | None:
    """What a million samples cost over a stretch of a job (the whole job, a round): what the stretch cost over the
    samples it trained; the same as :func:`cost_per_million_samples` at the stretch's mean rate.  None when either
    is unknown, or nothing was trained."""
    if cost is None or not samples:
        return None
    return cost / samples * 1e6
