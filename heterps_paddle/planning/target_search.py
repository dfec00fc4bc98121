"""The highest throughput target at which a yes/no question about plans still holds.

Two questions are asked of targets: "does some plan meet it?" (``heterps plan`` telling a user what is reachable)
and "does the cheapest plan meeting it fit the budget?" (budget mode).  Both only ever turn from yes to no as the
target rises (a plan that meets a target meets every lower one), so both are answered by the same bisection, over
log throughput because targets span decades.
"""

from __future__ import annotations

import math
from typing import Callable


def highest_target(holds: Callable[[float], bool], low: float, high: float, tolerance: float) -> float:
    """The highest target in ``[low, high)`` where ``holds`` is true, within ``tolerance`` (relative) below the
    true limit; ``holds(low)`` must be true and ``holds(high)`` false."""
    while high > low * (1 + tolerance):
        middle = math.sqrt(low * high)
        if holds(middle):
            low = middle
        else:
            high = middle
    return low
