"""What the DPs over stage boundaries share: ``exact``'s over the whole plan (``exact.forward_dp``) and the
refinement's over a window of a plan's stages (``window_covers.priced_cover``).

Both fill ``best[j, t]``, the cheapest cover of the first ``j`` layers whose last stage has type ``t``, and
``begins[j, t]``, the boundary where that last stage begins. A stage is a maximal run of one type, so two
adjacent stages differ in type: the cover before a stage of type ``t`` is the cheapest one ending in any other
type, ``other_type_min``. ``trace_back`` reads the cheapest cover off the two tables.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def other_type_min(values: NDArray[np.float64]) -> NDArray[np.float64]:
    """out[..., t] = min over t' != t of values[..., t'] (inf when there is a single type)."""
    if values.shape[-1] == 1:
        return np.full_like(values, np.inf)
    two = np.partition(values, 1, axis=-1)  # the smallest, then the second smallest (equal to it on a tie)
    return np.where(values == two[..., :1], two[..., 1:2], two[..., :1])


def trace_back(best: NDArray[np.float64], begins: NDArray[np.intp]) -> tuple[float, NDArray[np.intp] | None]:
    """The cheapest cover of all ``best.shape[0] - 1`` layers: its cost and a type per layer (None, with an
    infinite cost, when nothing covers them). Walked back from the last boundary: the last stage is the cheapest
    of any type; each stage before the one of type ``t`` beginning at ``i`` is the cheapest of another type
    ending at ``i``. Ties go to the lowest type index, as ``np.argmin`` breaks them."""
    n = best.shape[0] - 1
    kind = int(np.argmin(best[n]))
    value = float(best[n, kind])
    if not np.isfinite(value):
        return value, None
    cover = np.empty(n, dtype=np.intp)
    end = n
    while end > 0:
        begin = int(begins[end, kind])
        cover[begin:end] = kind
        if begin > 0:
            before = best[begin].copy()
            before[kind] = np.inf
            kind = int(np.argmin(before))
        end = begin
    return value, cover
