"""Re-covers: a window of a plan's consecutive stages replaced by the cheapest cover of its layers, a DP over
the window's boundaries (``cover_dp``) where a chain of single moves (``plan_moves``) would have to go uphill.

- ``recover``: 2 to ``RECOVER_PIECES`` new stages at the stages' own prices, tried by ``refine.descend`` at a
  local optimum;
- ``priced_cover``: any number of new stages under given unit prices, the step of ``refine.reprice``.

Neither DP sees the shared unit limits: the searches that call them steer them with surcharges and prices.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

from heterps_paddle.planning.schedulers.cover_dp import other_type_min, trace_back
from heterps_paddle.planning.schedulers.plan_moves import MoveScorer, Stages, cheaper

RECOVER_PIECES = 4  # new stages of a re-cover at most


def recover(
    scorer: MoveScorer, stages: Stages, first: int, last: int, surcharge: NDArray[np.float64] | None = None
) -> NDArray[np.intp] | None:
    """The plan with stages ``first``..``last`` replaced by the cheapest cover of their layers with two to
    ``RECOVER_PIECES`` stages (the outer ones may join the neighbouring stage of their type), ignoring the
    shared limits (``surcharge``, a factor per type on the new stages' costs, steers it off types whose limit
    the last cover broke); None if no such cover is cheaper than them. A window of a few stages: it finds the
    replacement of an expensive type by a sequence of cheaper ones that no chain of single moves reaches
    downhill (each step would add a stage, and a stage pays for a whole unit)."""
    s, e = int(stages.start[first]), int(stages.end[last])
    if e - s < 2:
        return None
    cost = scorer.cost_model.stage_tables().cost  # inf where a stage breaks its type's limit alone
    types = np.arange(scorer.T)
    cuts = np.arange(s + 1, e)
    has_left, has_right = first > 0, last < stages.start.size - 1
    left_type = int(stages.type[first - 1]) if has_left else -1
    right_type = int(stages.type[last + 1]) if has_right else -1
    head = cost[types[None, :], s, cuts[:, None]]  # [cuts, a]: the first piece [s, cut)
    tail = cost[types[None, :], cuts[:, None], e]  # [cuts, z]: the last piece [cut, e)
    if has_left:  # a first piece of the left neighbour's type joins it
        head[:, left_type] = cost[left_type, stages.start[first - 1], cuts] - stages.cost[first - 1]
    if has_right:
        tail[:, right_type] = cost[right_type, cuts, stages.end[last + 1]] - stages.cost[last + 1]
    middle = cost[types[:, None, None], cuts[None, :, None], cuts[None, None, :]]  # [b, c1, c2]
    replaced = float(stages.cost_prefix[last + 1] - stages.cost_prefix[first])
    if surcharge is not None:
        head, tail, middle = head * surcharge[None, :], tail * surcharge[None, :], middle * surcharge[:, None, None]

    def best_other(values: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.intp]]:
        """[rows, t]: the least of values[row, t'] over t' != t, and that t'."""
        if values.shape[1] < 2:  # one type (a cluster of one type, e.g. what a job has left): no other
            return np.full_like(values, np.inf), np.zeros(values.shape, dtype=np.intp)
        order = np.argsort(values, axis=1)[:, :2]
        rows = np.arange(values.shape[0])
        least, second = values[rows, order[:, 0]], values[rows, order[:, 1]]
        is_least = types[None, :] == order[:, :1]
        return np.where(is_least, second[:, None], least[:, None]), np.where(is_least, order[:, 1:2], order[:, :1])

    # cover[k][c, t]: the cheapest cover of [s, cut c) by k + 1 pieces whose last has type t; starts[k - 1]
    # [t, c]: the cut where that last piece starts.
    cover = [head]
    starts: list[NDArray[np.intp]] = []
    best_value, best_pieces, best_end = np.inf, 0, (0, 0)
    for pieces in range(2, RECOVER_PIECES + 1):
        other, _ = best_other(cover[-1])  # [cuts, t]: the best cover ending in a type other than t
        with np.errstate(invalid="ignore"):
            closing = other + tail  # [cut, z]: close the cover with a last piece [cut, e) of type z
        flat = int(np.argmin(closing))
        if closing.flat[flat] < best_value:
            best_value, best_pieces, best_end = float(closing.flat[flat]), pieces, divmod(flat, scorer.T)
        if pieces == RECOVER_PIECES:
            break
        with np.errstate(invalid="ignore"):
            through = other.T[:, :, None] + middle  # [b, c1, c2]
        start_cut = np.argmin(through, axis=1)  # [b, c2]
        cover.append(np.take_along_axis(through, start_cut[:, None, :], axis=1)[:, 0, :].T)  # [c2, b]
        starts.append(start_cut)
    if not np.isfinite(best_value) or not cheaper(best_value, replaced):
        return None
    moved = np.array(stages.type[stages.of_layer], dtype=np.intp)
    cut_index, kind = best_end
    moved[cuts[cut_index] : e] = kind
    # Walk back: the piece before a piece of type ``kind`` starting at ``cut_index`` is the best other-type
    # cover with one piece fewer, ending there.
    for k in range(best_pieces - 2, -1, -1):
        previous_kind = int(best_other(cover[k])[1][cut_index, kind])
        start_index = int(starts[k - 1][previous_kind, cut_index]) if k > 0 else -1
        moved[s if k == 0 else cuts[start_index] : cuts[cut_index]] = previous_kind
        cut_index, kind = start_index, previous_kind
    return moved


def priced_cover(
    scorer: MoveScorer, stages: Stages, first: int, last: int, unit_price: NDArray[np.float64]
) -> tuple[NDArray[np.intp], float] | None:
    """The cheapest cover of the layers of stages ``first``..``last`` by any number of stages, each unit of
    type t costing ``unit_price[t]`` (the outer pieces may join the neighbouring stage of their type), and
    its priced cost (the joined neighbours' own cost taken off); None if nothing covers them. A DP over the
    window's cuts: best[c, t] is the cheapest cover of the window's first c layers whose last stage has
    type t, O(window layers^2 x types). It sees no shared limit: ``reprice`` steers it with the prices."""
    s, e = int(stages.start[first]), int(stages.end[last])
    width = e - s
    with np.errstate(invalid="ignore"):
        piece = scorer.units[:, s : e + 1, s : e + 1] * unit_price[:, None, None]  # [t, from cut, to cut]
        if first > 0:  # a first piece of the left neighbour's type joins it
            left, left_start = int(stages.type[first - 1]), int(stages.start[first - 1])
            left_cost = stages.units[first - 1] * unit_price[left]
            piece[left, 0, 1:] = scorer.units[left, left_start, s + 1 : e + 1] * unit_price[left] - left_cost
        if last < stages.start.size - 1:  # a last piece of the right neighbour's type joins it
            right, right_end = int(stages.type[last + 1]), int(stages.end[last + 1])
            right_cost = stages.units[last + 1] * unit_price[right]
            piece[right, :width, width] = scorer.units[right, s:e, right_end] * unit_price[right] - right_cost
            if first > 0 and left == right:  # one piece joining both
                piece[right, 0, width] = (
                    scorer.units[right, left_start, right_end] * unit_price[right] - left_cost - right_cost
                )
    piece = np.where(np.isnan(piece), np.inf, piece)
    best = np.full((width + 1, scorer.T), np.inf)
    begins = np.zeros((width + 1, scorer.T), dtype=np.intp)
    other = np.zeros(scorer.T)  # the cheapest cover up to this cut ending in another type than t
    for cut in range(width):
        if cut > 0:
            other = other_type_min(best[cut])
        with np.errstate(invalid="ignore"):
            through = other[:, None] + piece[:, cut, cut + 1 :]  # [t, end cuts]
        better = through < best[cut + 1 :].T
        best[cut + 1 :] = np.where(better.T, through.T, best[cut + 1 :])
        begins[cut + 1 :] = np.where(better.T, cut, begins[cut + 1 :])
    value, cover = trace_back(best, begins)
    return None if cover is None else (cover, value)
