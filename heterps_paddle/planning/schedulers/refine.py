"""Local refinement of a plan: moves scored incrementally from the stage tables, then best-improvement descent.

Two kinds of move, each changing only the stages next to it, so each is a few lookups in the stage tables
instead of a whole plan's evaluation (200 layers x 64 types has 1.3 million segment moves: as whole plans that
is gigabytes and seconds per round, as lookups a few numpy operations per type):

- segment move: layers [i, j) get one type t. The stage holding layer i-1 keeps its part before i (or, when it
  already has type t, grows into the new stage), the stage holding layer j keeps its part from j on (or joins),
  every stage in between goes. This covers moving a layer, a whole stage or a boundary, and merging stages.
- split move: one stage [s, e) becomes [s, m) of type a and [m, e) of type b (either may join its neighbour).
  A stage pays for at least one whole unit, so replacing an expensive type that holds a long run with cheaper
  ones often needs two new stages at once: no single segment move lowers the cost on the way there.

``descend`` takes the best move of each round and then each of the next best that still improves the plan
(checked on the whole plan); a plan over the limits is repaired first (fewest units over the limits, then cost).
At a local optimum it tries two larger steps:

- ejection: where the shared unit limits bind, the best plans often need two moves at once (one stage gives up a
  type's units so that another can take them): each of the cheapest few moves that break a limit, followed by
  the best move that repairs it;
- re-cover: up to ``RECOVER_SPAN`` consecutive stages replaced by the cheapest cover of their layers with 2 to
  ``RECOVER_PIECES`` stages, a DP bounded to that window and that many pieces. Replacing an expensive type over
  a long run by a sequence of cheaper ones raises the cost at every single step on the way; this takes it in
  one. The DP does not see the shared limits; where its cover breaks one, the types over their limit get a
  surcharge and it tries again.

Where the shared limits bind hard, two searches around them (after a descent):

- strategic oscillation (``oscillate``): descents on the cost plus a price per unit over a limit;
- priced re-cover (``reprice``): windows of ``REPRICE_SPAN`` stages replaced by their cheapest cover under unit
  prices that subgradient steps raise on the types the plan takes too many units of, each round's plan repaired
  by a descent: the better plans there differ from a local optimum in several places at once, linked by the
  units they trade.

A move is feasible when every type that gains units stays within max_units and every type already over its
limit comes back within it; the rest can only lose units.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import numpy as np
from numpy.typing import NDArray

from heterps_paddle.planning.cost_model import CostModel, Evaluation
from heterps_paddle.planning.schedulers.cover_dp import other_type_min, trace_back

# A move must lower the cost by more than this share to count: plateaus of equal cost would loop otherwise.
_RELATIVE_GAIN = 1e-12
# How many of the best moves a descent round tries, one after another on the plan as it goes.
MOVES_PER_ROUND = 16
# How many limit-breaking moves an ejection tries at a local optimum, cheapest first.
EJECTION_TRIES = 6
# How many consecutive stages a re-cover replaces at most, and with how many new stages at most.
RECOVER_SPAN = 4
RECOVER_PIECES = 4
RECOVER_TRIES = 4  # covers tried per window when the cheapest breaks a shared limit
# Strategic oscillation (``oscillate``): rounds, and the price of a unit over a limit, first as a share of the
# type's price, then multiplied or divided by the growth each round.
OSCILLATION_ROUNDS = 12
PENALTY_START = 0.25
PENALTY_GROWTH = 2.0
# Priced re-cover (``reprice``): how many consecutive stages one window DP replaces (the windows overlap by half),
# the subgradient step of a type's price per unit over its limit (a share of its price; halved after every
# REPRICE_HALVING rounds in a row that found nothing cheaper), the rounds at most, and how many rounds in a row
# without a cheaper plan end it.
REPRICE_SPAN = 16
REPRICE_STEP = 0.05
REPRICE_HALVING = 8
REPRICE_ROUNDS = 80
REPRICE_PATIENCE = 24


@dataclass(frozen=True)
class _Stages:
    """A plan's maximal runs of one type, and per layer the run that holds it."""

    start: NDArray[np.intp]
    end: NDArray[np.intp]
    type: NDArray[np.intp]
    units: NDArray[np.float64]
    cost: NDArray[np.float64]
    of_layer: NDArray[np.intp]
    cost_prefix: NDArray[np.float64]  # [stages + 1]
    units_prefix: NDArray[np.float64]  # [stages + 1, types]: units per type of the stages before each index
    used: NDArray[np.float64]  # [types]

    @property
    def total(self) -> float:
        return float(self.cost_prefix[-1])


@dataclass(frozen=True)
class Move:
    """One move and the plan's cost after it."""

    cost: float
    excess: float  # units over the limits after it (0: feasible)
    kind: str  # "segment" or "split"
    start: int  # segment: [start, end) gets first_type; split: the stage's [start, cut) and [cut, end)
    end: int
    cut: int
    first_type: int
    second_type: int

    def apply(self, assignment: NDArray[np.intp]) -> NDArray[np.intp]:
        moved = np.array(assignment, dtype=np.intp)
        if self.kind == "segment":
            moved[self.start : self.end] = self.first_type
        else:
            moved[self.start : self.cut] = self.first_type
            moved[self.cut : self.end] = self.second_type
        return moved


_Scorer = TypeVar("_Scorer", bound=Callable[..., Any])


# A plan being refined can hold a stage that cannot run (cost and units inf): a move that removes it computes
# inf - inf, NaN, and a NaN cost is not finite, so that move is scored inf (never taken), as every move that keeps
# such a stage is.  The move scorers run whole under this errstate: these NaNs were printed, as numpy warnings, on a
# re-planning coordinator's console.
def _nan_moves_are_not_taken(scorer: _Scorer) -> _Scorer:
    return np.errstate(invalid="ignore")(scorer)  # an errstate per method: one is not re-entrant


class MoveScorer:
    """Scores the moves of one cost model's plans (the segment arrays are built once per cost model)."""

    def __init__(self, cost_model: CostModel):
        self.cost_model = cost_model
        tables = cost_model.stage_tables()
        self.n, self.T = cost_model.num_layers, cost_model.num_types
        starts, ends = np.triu_indices(self.n + 1, 1)
        self.segment_start, self.segment_end = starts.astype(np.intp), ends.astype(np.intp)
        # Units of a stage that cannot run (no count reaches the target, or a kind the first stage may not
        # have) are infinite here, so a move that creates one is never feasible.
        # Laid out [type, start, end] in memory (the stage tables are [end, start, type]): the segment scoring
        # reads one stage per segment and type from ``units_by_type``, a view with one contiguous row per type
        # indexed start * (n + 1) + end, and a gather from contiguous memory is several times faster.
        self.units: NDArray[np.float64] = np.ascontiguousarray(np.where(np.isfinite(tables.time), tables.units, np.inf))
        self.units_by_type = self.units.reshape(self.T, -1)
        self.price = cost_model.price
        self.limit = cost_model.max_units.astype(float)

    def stages(self, assignment: NDArray[np.intp]) -> _Stages:
        a = np.asarray(assignment, dtype=np.intp)
        boundaries = np.flatnonzero(np.diff(a)) + 1
        start = np.concatenate([[0], boundaries]).astype(np.intp)
        end = np.concatenate([boundaries, [self.n]]).astype(np.intp)
        types = a[start]
        units = self.units[types, start, end]
        with np.errstate(invalid="ignore"):
            cost = units * self.price[types]
        of_layer = np.repeat(np.arange(start.size), end - start)
        per_type = np.zeros((start.size + 1, self.T))
        per_type[np.arange(1, start.size + 1), types] = units
        units_prefix = np.cumsum(per_type, axis=0)
        cost_prefix = np.concatenate([[0.0], np.cumsum(cost)])
        return _Stages(start, end, types, units, cost, of_layer, cost_prefix, units_prefix, units_prefix[-1])

    def state(self, stages: _Stages) -> tuple[float, float]:
        """What a descent minimises, in this order: units over the limits, then cost."""
        return float(np.maximum(0.0, stages.used - self.limit).sum()), stages.total

    @_nan_moves_are_not_taken
    def segment_moves(
        self, stages: _Stages, weights: NDArray[np.float64] | None = None
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """[types, segments]: the plan's cost after each segment move, and its units over the limits (inf where
        a new stage cannot run), each type's units counted ``weights[type]`` times when given (a price per unit
        over the limit: ``penalised_descent``). Everything that does not depend on the new type is worked out
        once per segment; per type it is a lookup of the new stage and a few operations."""
        w = np.ones(self.T) if weights is None else weights
        seg_start, seg_end = self.segment_start, self.segment_end
        has_left, has_right = seg_start > 0, seg_end < self.n
        left = stages.of_layer[np.maximum(seg_start - 1, 0)]  # the stage holding layer i-1 (first removed)
        right = stages.of_layer[np.minimum(seg_end, self.n - 1)]  # the stage holding layer j (last removed)
        first = np.where(has_left, left, 0)
        last = np.where(has_right, right, stages.start.size - 1)
        kept_cost = stages.total - (stages.cost_prefix[last + 1] - stages.cost_prefix[first])
        left_type, right_type = stages.type[left], stages.type[right]
        left_start, right_end = stages.start[left], stages.end[right]

        prefix_by_type = np.ascontiguousarray(stages.units_prefix.T)  # [types, stages + 1]

        def removed(kind: NDArray[np.intp]) -> NDArray[np.float64]:
            """Units of type ``kind`` (per segment) in the stages the move takes out."""
            taken: NDArray[np.float64] = stages.units_prefix[last + 1, kind] - stages.units_prefix[first, kind]
            return taken

        def removed_of(kind: int) -> NDArray[np.float64]:
            """``removed`` for one type for every segment (a row of the prefix sums, no 2-D gather)."""
            taken: NDArray[np.float64] = prefix_by_type[kind][last + 1] - prefix_by_type[kind][first]
            return taken

        # The pieces of the neighbouring stages that stay when the new type differs from theirs.
        left_units = np.where(has_left, self.units[left_type, left_start, seg_start], 0.0)
        right_units = np.where(has_right, self.units[right_type, seg_end, right_end], 0.0)
        same_neighbour = has_left & has_right & (left_type == right_type)
        with np.errstate(invalid="ignore"):
            pieces_cost = left_units * self.price[left_type], right_units * self.price[right_type]
            # Units over the limit of a neighbour's type with its piece kept (when the left piece stays and the
            # right neighbour has the same type, the right piece stays too: both differ from the new type).
            left_over = np.maximum(
                0.0,
                stages.used[left_type]
                - removed(left_type)
                + left_units
                + np.where(same_neighbour, right_units, 0.0)
                - self.limit[left_type],
            )
            right_over = np.maximum(
                0.0, stages.used[right_type] - removed(right_type) + right_units - self.limit[right_type]
            )
        right_over = np.where(same_neighbour, 0.0, right_over)  # counted with the left one
        if weights is not None:
            left_over, right_over = left_over * w[left_type], right_over * w[right_type]
        # Types already over their limit that the move does not add to: what is left of their excess.
        rest = np.zeros(seg_start.size)
        rest_of: dict[int, NDArray[np.float64]] = {}
        for y in np.flatnonzero(stages.used > self.limit):
            remaining = np.maximum(0.0, stages.used[y] - removed_of(int(y)) - self.limit[y])
            rest_of[int(y)] = w[y] * np.where(
                (has_left & (left_type == y)) | (has_right & (right_type == y)), 0.0, remaining
            )
            rest += rest_of[int(y)]
        # Per type: does the new stage join the left / right neighbour (same type), else its piece stays.
        left_kind = np.where(has_left, left_type, -1)
        right_kind = np.where(has_right, right_type, -1)
        left_cost = np.where(has_left, pieces_cost[0], 0.0)
        right_cost = np.where(has_right, pieces_cost[1], 0.0)
        left_over = np.where(has_left, left_over, 0.0)
        right_over = np.where(has_right, right_over, 0.0)
        costs = np.empty((self.T, seg_start.size))
        excess = np.empty((self.T, seg_start.size))
        with np.errstate(invalid="ignore"):
            for t in range(self.T):
                # A neighbour of the new type joins the new stage (its piece is gone); any other keeps its piece.
                joins_left, joins_right = left_kind == t, right_kind == t
                middle_units = self.units_by_type[t].take(
                    np.where(joins_left, left_start, seg_start) * (self.n + 1)
                    + np.where(joins_right, right_end, seg_end)
                )
                costs[t] = (
                    kept_cost
                    + np.where(joins_left, 0.0, left_cost)
                    + np.where(joins_right, 0.0, right_cost)
                    + middle_units * self.price[t]
                )
                over = (
                    w[t] * np.maximum(0.0, stages.used[t] - removed_of(t) + middle_units - self.limit[t])
                    + np.where(joins_left, 0.0, left_over)
                    + np.where(joins_right, 0.0, right_over)
                    + rest
                )
                if t in rest_of:
                    over -= rest_of[t]
                excess[t] = np.where(np.isfinite(costs[t]), over, np.inf)
        return costs, excess

    @_nan_moves_are_not_taken
    def split_moves(
        self, stages: _Stages, q: int, weights: NDArray[np.float64] | None = None
    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """[cuts, a, b]: the plan's cost after stage ``q`` becomes [start, cut) on type a and [cut, end) on b (cut
        from start + 1 on), and its units over the limits (inf for a == b, a segment move, and where a new stage
        cannot run), weighted per type as in ``segment_moves``."""
        w = np.ones(self.T) if weights is None else weights
        s, e, x = int(stages.start[q]), int(stages.end[q]), int(stages.type[q])
        cuts = np.arange(s + 1, e)
        types = np.arange(self.T)
        has_left, has_right = q > 0, q < stages.start.size - 1
        left_type = int(stages.type[q - 1]) if has_left else -1
        right_type = int(stages.type[q + 1]) if has_right else -1
        # The first piece starts at the left neighbour's start when it takes the neighbour's type (they merge).
        first_start = np.where(types == left_type, stages.start[q - 1] if has_left else s, s)
        second_end = np.where(types == right_type, stages.end[q + 1] if has_right else e, e)
        first_units = self.units[types[None, :], first_start[None, :], cuts[:, None]]  # [cuts, a]
        second_units = self.units[types[None, :], cuts[:, None], second_end[None, :]]  # [cuts, b]
        left_cost = stages.cost[q - 1] if has_left else 0.0
        right_cost = stages.cost[q + 1] if has_right else 0.0
        base = stages.total - stages.cost[q] - np.where(types == left_type, left_cost, 0.0)  # [a]
        with np.errstate(invalid="ignore"):
            first = base[None, :] + first_units * self.price[None, :]  # [cuts, a]
            second = second_units * self.price[None, :] - np.where(types == right_type, right_cost, 0.0)  # [cuts, b]
            costs = first[:, :, None] + second[:, None, :]
        # Units after the move of type a (first piece) and of type b (second piece); a != b.
        left_units = stages.units[q - 1] if has_left else 0.0
        right_units = stages.units[q + 1] if has_right else 0.0
        own = stages.units[q]
        without_stage = stages.used - np.where(types == x, own, 0.0)  # [types]: use once stage q is gone
        a_use = (without_stage - np.where(types == left_type, left_units, 0.0))[None, :] + first_units  # [cuts, a]
        b_use = (without_stage - np.where(types == right_type, right_units, 0.0))[None, :] + second_units  # [cuts, b]
        with np.errstate(invalid="ignore"):
            a_over = w[None, :] * np.maximum(0.0, a_use - self.limit[None, :])
            b_over = w[None, :] * np.maximum(0.0, b_use - self.limit[None, :])
        excess = a_over[:, :, None] + b_over[:, None, :]
        for y in np.flatnonzero(stages.used > self.limit):  # a type over its limit that is neither a nor b
            use_y = (
                stages.used[y]
                - (x == y) * own
                - np.where(types == left_type, float(left_type == y) * left_units, 0.0)[None, :, None]
                - np.where(types == right_type, float(right_type == y) * right_units, 0.0)[None, None, :]
            )
            neither = (types != y)[None, :, None] & (types != y)[None, None, :]
            excess = excess + np.where(neither, w[y] * np.maximum(0.0, use_y - self.limit[y]), 0.0)
        same = types[:, None] == types[None, :]  # a == b is a segment move, scored there
        excess = np.where(np.isfinite(costs) & ~same[None], excess, np.inf)
        return costs, excess

    def recover(
        self, stages: _Stages, first: int, last: int, surcharge: NDArray[np.float64] | None = None
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
        cost = self.cost_model.stage_tables().cost  # inf where a stage breaks its type's limit alone
        types = np.arange(self.T)
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
                best_value, best_pieces, best_end = float(closing.flat[flat]), pieces, divmod(flat, self.T)
            if pieces == RECOVER_PIECES:
                break
            with np.errstate(invalid="ignore"):
                through = other.T[:, :, None] + middle  # [b, c1, c2]
            start_cut = np.argmin(through, axis=1)  # [b, c2]
            cover.append(np.take_along_axis(through, start_cut[:, None, :], axis=1)[:, 0, :].T)  # [c2, b]
            starts.append(start_cut)
        if not np.isfinite(best_value) or not best_value < replaced - _RELATIVE_GAIN * max(1.0, replaced):
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
        self, stages: _Stages, first: int, last: int, unit_price: NDArray[np.float64]
    ) -> tuple[NDArray[np.intp], float] | None:
        """The cheapest cover of the layers of stages ``first``..``last`` by any number of stages, each unit of
        type t costing ``unit_price[t]`` (the outer pieces may join the neighbouring stage of their type), and
        its priced cost (the joined neighbours' own cost taken off); None if nothing covers them. A DP over the
        window's cuts: best[c, t] is the cheapest cover of the window's first c layers whose last stage has
        type t, O(window layers^2 x types). It sees no shared limit: ``reprice`` steers it with the prices."""
        s, e = int(stages.start[first]), int(stages.end[last])
        width = e - s
        with np.errstate(invalid="ignore"):
            piece = self.units[:, s : e + 1, s : e + 1] * unit_price[:, None, None]  # [t, from cut, to cut]
            if first > 0:  # a first piece of the left neighbour's type joins it
                left, left_start = int(stages.type[first - 1]), int(stages.start[first - 1])
                left_cost = stages.units[first - 1] * unit_price[left]
                piece[left, 0, 1:] = self.units[left, left_start, s + 1 : e + 1] * unit_price[left] - left_cost
            if last < stages.start.size - 1:  # a last piece of the right neighbour's type joins it
                right, right_end = int(stages.type[last + 1]), int(stages.end[last + 1])
                right_cost = stages.units[last + 1] * unit_price[right]
                piece[right, :width, width] = self.units[right, s:e, right_end] * unit_price[right] - right_cost
                if first > 0 and left == right:  # one piece joining both
                    piece[right, 0, width] = (
                        self.units[right, left_start, right_end] * unit_price[right] - left_cost - right_cost
                    )
        piece = np.where(np.isnan(piece), np.inf, piece)
        best = np.full((width + 1, self.T), np.inf)
        begins = np.zeros((width + 1, self.T), dtype=np.intp)
        other = np.zeros(self.T)  # the cheapest cover up to this cut ending in another type than t
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

    def best_move(self, assignment: NDArray[np.intp]) -> Move | None:
        """The move that leaves the fewest units over the limits, the cheapest among those."""
        found = self.best_moves(assignment, 1)
        return found[0] if found else None

    def best_moves(self, assignment: NDArray[np.intp], count: int) -> list[Move]:
        """Up to ``count`` moves, fewest units over the limits first, then cheapest."""
        found = self._candidates(assignment, count, "repair")
        return sorted(found, key=lambda move: (move.excess, move.cost))[:count]

    def breaking_moves(self, assignment: NDArray[np.intp], count: int) -> list[Move]:
        """The ``count`` cheapest moves of a plan that leave some units over the limits."""
        return sorted(self._candidates(assignment, count, "breaking"), key=lambda move: move.cost)[:count]

    def penalised_moves(self, assignment: NDArray[np.intp], count: int, penalty: NDArray[np.float64]) -> list[Move]:
        """Up to ``count`` moves with the least cost plus ``penalty[type]`` per unit of a type over its limit
        (their ``excess`` is that penalty), least first."""
        found = self._candidates(assignment, count, "penalised", penalty)
        return sorted(found, key=lambda move: move.cost + move.excess)[:count]

    def _candidates(
        self, assignment: NDArray[np.intp], count: int, mode: str, weights: NDArray[np.float64] | None = None
    ) -> list[Move]:
        stages = self.stages(assignment)
        found = self._pick(*self.segment_moves(stages, weights), count, mode, stages, None)
        for q in range(stages.start.size):
            if stages.end[q] - stages.start[q] >= 2:
                found += self._pick(*self.split_moves(stages, q, weights), count, mode, stages, q)
        return found

    def _pick(
        self,
        costs: NDArray[np.float64],
        excess: NDArray[np.float64],
        count: int,
        mode: str,
        stages: _Stages,
        q: int | None,
    ) -> list[Move]:
        """The best ``count`` of one array of moves: by cost among those over a limit (``"breaking"``), by cost
        plus the (weighted) units over the limits (``"penalised"``), else (``"repair"``) by units over the limits
        and then cost."""
        costs, excess = costs.ravel(), excess.ravel()
        if mode == "breaking":
            key = np.where((excess > 0) & np.isfinite(excess), costs, np.inf)
        elif mode == "penalised":
            with np.errstate(invalid="ignore"):
                key = np.where(np.isfinite(excess), costs + excess, np.inf)
        else:
            fewest = excess.min()
            key = np.where(excess == fewest, costs, np.inf)
        if count == 1:
            chosen = np.array([np.argmin(key)])
        else:
            chosen = np.argpartition(key, count)[:count] if count < key.size else np.arange(key.size)
        moves = []
        for flat in chosen:
            if not np.isfinite(key[flat]):
                continue
            cost, over = float(costs[flat]), float(excess[flat])
            if q is None:
                t, segment = divmod(int(flat), self.segment_start.size)
                start, end = int(self.segment_start[segment]), int(self.segment_end[segment])
                moves.append(Move(cost, over, "segment", start, end, end, t, t))
            else:
                cut_index, rest = divmod(int(flat), self.T * self.T)
                a, b = divmod(rest, self.T)
                start = int(stages.start[q])
                moves.append(Move(cost, over, "split", start, int(stages.end[q]), start + 1 + cut_index, a, b))
        return moves


def descend(
    cost_model: CostModel,
    assignment: NDArray[np.intp],
    scorer: MoveScorer | None = None,
    deadline: float | None = None,
    jumps: bool = True,
) -> Evaluation:
    """Best-improvement descent from a plan until no move, and no ejection, makes it better: fewer units over
    the limits first (so an infeasible start is repaired where a sequence of moves can), then a lower cost.
    ``jumps=False``: no ejection and no re-cover at a local optimum (most of a long descent's time on a large
    plan; ``reprice`` repairs with it and polishes only what improves). Stops early, with the plan reached so
    far, once ``time.perf_counter()`` passes ``deadline``."""
    scorer = scorer or MoveScorer(cost_model)
    current = np.asarray(assignment, dtype=np.intp)
    state = scorer.state(scorer.stages(current))
    while not _late(deadline):
        # The best move, then each of the next best that still improves the plan once the ones before it are
        # in (checked on the whole plan): one scoring of all moves serves several steps where the plan has
        # many stages that each want their own fix.
        improved = False
        for move in scorer.best_moves(current, MOVES_PER_ROUND):
            moved = move.apply(current)
            candidate = scorer.state(scorer.stages(moved))
            if _better(candidate, state):
                current, state, improved = moved, candidate, True
        if improved:
            continue
        if state[0] > 0 or not jumps:
            break
        jump = _ejection(scorer, current, state[1], deadline) or _recover(scorer, current, state[1], deadline)
        if jump is None:
            break
        current, state = jump[0], (0.0, jump[1])
    return cost_model.evaluate(current.tolist())


def penalised_value(scorer: MoveScorer, stages: _Stages, penalty: NDArray[np.float64]) -> float:
    """A plan's cost plus ``penalty[type]`` for each unit of a type over its limit."""
    return stages.total + float((penalty * np.maximum(0.0, stages.used - scorer.limit)).sum())


def penalised_descent(
    scorer: MoveScorer, assignment: NDArray[np.intp], penalty: NDArray[np.float64], deadline: float | None = None
) -> NDArray[np.intp]:
    """Descent on the cost plus ``penalty[type]`` per unit over a type's limit: a plan may go over a limit where
    what it saves elsewhere is worth more than the penalty. Returns the plan it ends at (maybe over the limits)."""
    current = np.asarray(assignment, dtype=np.intp)
    value = penalised_value(scorer, scorer.stages(current), penalty)
    while not _late(deadline):
        improved = False
        for move in scorer.penalised_moves(current, MOVES_PER_ROUND, penalty):
            moved = move.apply(current)
            candidate = penalised_value(scorer, scorer.stages(moved), penalty)
            if candidate < value - _RELATIVE_GAIN * max(1.0, abs(value)):
                current, value, improved = moved, candidate, True
        if not improved:
            break
    return current


def oscillate(
    cost_model: CostModel,
    assignment: NDArray[np.intp],
    scorer: MoveScorer | None = None,
    deadline: float | None = None,
    rounds: int = OSCILLATION_ROUNDS,
) -> Evaluation:
    """Strategic oscillation around the shared limits, from a plan that keeps them: where limits bind hard, the
    better plans lie behind chains of exchanges (a stage frees units of one type so that another stage can take
    them, which frees units of a third ...), each step of which breaks some limit, so no descent that keeps the
    limits, and no single ejection, walks there. Each round descends on the cost plus a price per unit over a
    limit (``penalised_descent``), then repairs a copy of where it ended with ``descend``; the penalty of every
    type left over its limit rises (``PENALTY_GROWTH``), and all fall when the round ended within the limits, so
    the search crosses the boundary back and forth from where it was. Returns the cheapest repaired plan, never
    worse than ``assignment``."""
    scorer = scorer or MoveScorer(cost_model)
    best = cost_model.evaluate(np.asarray(assignment).tolist())
    penalty = PENALTY_START * scorer.price.astype(float)
    current = np.asarray(assignment, dtype=np.intp)
    for _ in range(rounds):
        if _late(deadline):
            break
        current = penalised_descent(scorer, current, penalty, deadline)
        over = scorer.stages(current).used > scorer.limit
        repaired = descend(cost_model, current, scorer, deadline)
        if repaired.feasible and (
            not best.feasible or _better((0.0, repaired.cost_per_hour), (0.0, best.cost_per_hour))
        ):
            best = repaired
        if over.any():
            penalty[over] *= PENALTY_GROWTH
        else:
            penalty /= PENALTY_GROWTH
    return best


def reprice(
    cost_model: CostModel,
    assignment: NDArray[np.intp],
    scorer: MoveScorer | None = None,
    deadline: float | None = None,
    rounds: int = REPRICE_ROUNDS,
    patience: int = REPRICE_PATIENCE,
) -> Evaluation:
    """Priced re-cover, from a plan: where shared limits bind, the better plans differ from it in several places
    at once, linked by the units they trade (one region gives up a cheap type's units so that another can take
    them), which no chain of moves within the limits reaches. Each round replaces every window of
    ``REPRICE_SPAN`` consecutive stages (half overlapping) by its cheapest cover (``MoveScorer.priced_cover``)
    when one is cheaper under the current unit prices: a type's price plus a surcharge per unit, raised by a
    subgradient step where the plan ended over the type's limit and lowered where it left units free (the
    step halves after every ``REPRICE_HALVING`` rounds in a row without a cheaper plan). The plan so priced may
    break limits; a copy is repaired by descent without jumps (``descend(jumps=False)``), and the cheapest
    repaired plan is kept; at the end it gets a full descent. Stops after ``patience`` rounds in a row that
    found nothing cheaper, or ``rounds``, or at the deadline; returns the cheapest feasible plan, never worse
    than ``assignment``."""
    scorer = scorer or MoveScorer(cost_model)
    best = cost_model.evaluate(np.asarray(assignment).tolist())
    surcharge = np.zeros(scorer.T)
    step_size = REPRICE_STEP
    current = np.asarray(assignment, dtype=np.intp).copy()
    stale = 0
    for round_index in range(rounds):
        if stale >= patience or _late(deadline):
            break
        unit_price = scorer.price + surcharge
        stages = scorer.stages(current)
        stride = max(1, REPRICE_SPAN // 2)
        first = (round_index % 2) * (stride // 2)  # shift the windows' edges every other round
        while first < stages.start.size:
            last = min(first + REPRICE_SPAN, stages.start.size) - 1
            found = scorer.priced_cover(stages, first, last, unit_price)
            if found is not None:
                old = float((stages.units[first : last + 1] * unit_price[stages.type[first : last + 1]]).sum())
                if found[1] < old - _RELATIVE_GAIN * max(1.0, abs(old)):
                    current[stages.start[first] : stages.end[last]] = found[0]
                    stages = scorer.stages(current)
            first += stride
        over = stages.used - scorer.limit
        surcharge = np.maximum(0.0, surcharge + step_size * scorer.price * np.where(np.isfinite(over), over, 0.0))
        repaired = descend(cost_model, current, scorer, deadline, jumps=False)
        stale += 1
        if repaired.feasible and (
            not best.feasible or _better((0.0, repaired.cost_per_hour), (0.0, best.cost_per_hour))
        ):
            best, stale = repaired, 0
        elif stale % REPRICE_HALVING == 0:  # the prices cycle: smaller steps settle them nearer the limits
            step_size /= 2.0
    if best.feasible:  # the jumps, once, on the best plan
        polished = descend(cost_model, np.array(best.assignment), scorer, deadline)
        if polished.feasible:
            best = polished
    return best


def _recover(
    scorer: MoveScorer, current: NDArray[np.intp], current_cost: float, deadline: float | None = None
) -> tuple[NDArray[np.intp], float] | None:
    """The best re-cover of up to ``RECOVER_SPAN`` consecutive stages that keeps the limits and lowers the cost."""
    stages = scorer.stages(current)
    best: tuple[NDArray[np.intp], float] | None = None
    for first in range(stages.start.size):
        if _late(deadline):
            break
        for last in range(first, min(first + RECOVER_SPAN, stages.start.size)):
            # The cover ignores the shared limits: where it breaks one, the types over their limit cost more
            # in the next try, until a cover keeps them or none is cheaper.
            surcharge = np.ones(scorer.T)
            for _ in range(RECOVER_TRIES):
                moved = scorer.recover(stages, first, last, surcharge)
                if moved is None:
                    break
                after = scorer.stages(moved)
                over = after.used > scorer.limit
                if not over.any():
                    if _better(scorer.state(after), (0.0, current_cost if best is None else best[1])):
                        best = (moved, after.total)
                    break
                surcharge[over] *= 4.0
    return best


def _ejection(
    scorer: MoveScorer, current: NDArray[np.intp], current_cost: float, deadline: float | None = None
) -> tuple[NDArray[np.intp], float] | None:
    """The cheapest limit-breaking moves, each followed by its best repair; the best pair under the current cost."""
    best: tuple[NDArray[np.intp], float] | None = None
    for breaking in scorer.breaking_moves(current, EJECTION_TRIES):
        if not _better((0.0, breaking.cost), (0.0, current_cost)) or _late(deadline):
            break
        broken = breaking.apply(current)
        repair = scorer.best_move(broken)
        if (
            repair is not None
            and repair.excess == 0
            and _better((0.0, repair.cost), (0.0, current_cost if best is None else best[1]))
        ):
            best = (repair.apply(broken), repair.cost)
    return best


def _late(deadline: float | None) -> bool:
    return deadline is not None and time.perf_counter() > deadline


def _better(candidate: tuple[float, float], than: tuple[float, float]) -> bool:
    """Fewer units over the limits, or as many and a cost lower by more than rounding."""
    if candidate[0] != than[0]:
        return candidate[0] < than[0]
    return candidate[1] < than[1] - _RELATIVE_GAIN * max(1.0, abs(than[1]))
