"""Moves of a plan, scored incrementally from the stage tables (``MoveScorer``): what rl's refinement
(``refine.py``) searches with.

Two kinds of move, each changing only the stages next to it, so each is a few lookups in the stage tables
instead of a whole plan's evaluation (200 layers x 64 types has 1.3 million segment moves: as whole plans that
is gigabytes and seconds per round, as lookups a few numpy operations per type):

- segment move: layers [i, j) get one type t. The stage holding layer i-1 keeps its part before i (or, when it
  already has type t, grows into the new stage), the stage holding layer j keeps its part from j on (or joins),
  every stage in between goes. This covers moving a layer, a whole stage or a boundary, and merging stages.
- split move: one stage [s, e) becomes [s, m) of type a and [m, e) of type b (either may join its neighbour).
  A stage pays for at least one whole unit, so replacing an expensive type that holds a long run with cheaper
  ones often needs two new stages at once: no single segment move lowers the cost on the way there.

A move is feasible when every type that gains units stays within max_units and every type already over its
limit comes back within it; the rest can only lose units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, TypeVar

import numpy as np
from numpy.typing import NDArray

from heterps_paddle.planning.cost_model import CostModel

# A move must lower the cost by more than this share to count: plateaus of equal cost would loop otherwise.
_RELATIVE_GAIN = 1e-12


def cheaper(cost: float, than: float) -> bool:
    """``cost`` is lower than ``than`` by more than rounding (``_RELATIVE_GAIN``)."""
    return cost < than - _RELATIVE_GAIN * max(1.0, abs(than))


@dataclass(frozen=True)
class Stages:
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

    def stages(self, assignment: NDArray[np.intp]) -> Stages:
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
        return Stages(start, end, types, units, cost, of_layer, cost_prefix, units_prefix, units_prefix[-1])

    def state(self, stages: Stages) -> tuple[float, float]:
        """What a descent minimises, in this order: units over the limits, then cost."""
        return float(np.maximum(0.0, stages.used - self.limit).sum()), stages.total

    @_nan_moves_are_not_taken
    def segment_moves(
        self, stages: Stages, weights: NDArray[np.float64] | None = None
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
        self, stages: Stages, q: int, weights: NDArray[np.float64] | None = None
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
        stages: Stages,
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
