"""``exact``: a proven optimum of the cost model.

1. Every candidate stage ``(start, end, type)`` is provisioned once (prefix sums in the cost model).
2. A DP over stage boundaries (state: boundary, type of the stage ending there; adjacent stages differ in type
   because a stage is a maximal run) gives the optimum when stages of one type are not limited together. It
   ignores only the shared ``max_units`` limit, so it is a relaxation: if its plan respects the limit, done.
3. Otherwise a Lagrangian relaxation of the shared limits (the same DP with unit prices raised by multipliers)
   gives lower bounds and, from its feasible plans, upper bounds. A candidate stage whose best completion is
   bounded below by more than the best known plan cannot be in an optimum and is pruned; the rest go to a
   MILP (HiGHS through ``scipy.optimize.milp``, zero gap): path constraints over boundaries, one type per
   boundary side, and one unit budget per type.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Callable, Iterator, Sequence

import numpy as np
from numpy.typing import NDArray

from heterps_paddle.planning.cost_model import CostModel, Evaluation, StageTables
from heterps_paddle.planning.schedulers.base import Schedule, Scheduler, best_feasible, no_plan_reason
from heterps_paddle.planning.schedulers.cover_dp import other_type_min, trace_back
from heterps_paddle.planning.target_search import highest_target

_LAGRANGE_ITERATIONS = 40
_TOLERANCE = 1e-9
# First cutoffs of the MILP, above the Lagrangian bound relative to it (then the incumbent's cost, or none): the
# bound was within 0.6% of the optimum on the large tight cases, and candidates within 1% of it are hundreds.
_CUTOFF_MARGINS = (0.005, 0.02, 0.08)


def forward_dp(cost: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.int64]]:
    """F[j, t]: cheapest cover of layers [0, j) whose last stage has type t; also the argmin start."""
    T, n1, _ = cost.shape
    n = n1 - 1
    F = np.full((n + 1, T), np.inf)
    start = np.zeros((n + 1, T), dtype=np.int64)
    G = np.full((n + 1, T), np.inf)  # cheapest cover of [0, i) whose last stage is NOT of type t
    G[0] = 0.0
    by_end = np.ascontiguousarray(cost.transpose(2, 1, 0))  # no copy for the stage tables' layout
    for j in range(1, n + 1):
        candidates = G[:j] + by_end[j, :j]  # [start, type]
        start[j] = np.argmin(candidates, axis=0)
        F[j] = candidates[start[j], np.arange(T)]
        G[j] = other_type_min(F[j])
    return F, start


def backward_dp(cost: NDArray[np.float64]) -> NDArray[np.float64]:
    """B[i, t]: cheapest cover of layers [i, n) whose first stage has type t."""
    T, n1, _ = cost.shape
    n = n1 - 1
    B = np.full((n + 1, T), np.inf)
    H = np.full((n + 1, T), np.inf)
    H[n] = 0.0
    for i in range(n - 1, -1, -1):
        B[i] = np.min(cost[:, i, i + 1 :] + H[i + 1 :].T, axis=1)
        H[i] = other_type_min(B[i])
    return B


def dp_assignment(cost: NDArray[np.float64]) -> tuple[float, list[int] | None]:
    """The cheapest cover of all layers by stages costing ``cost[type, start, end]`` (inf: a stage that cannot
    be), its cost and a type per layer; None when nothing covers them. On the stage tables' costs: the cheapest
    plan when stages of one type are not limited together."""
    value, assignment = trace_back(*forward_dp(cost))
    return value, None if assignment is None else assignment.tolist()


def _completion_bounds(cost: NDArray[np.float64]) -> NDArray[np.float64]:
    """Lower bound, per candidate stage [type, start, end], of the cheapest plan that contains it."""
    F, _ = forward_dp(cost)
    B = backward_dp(cost)
    T, n1, _ = cost.shape
    before = other_type_min(F)  # [boundary, type]: cover of [0, i) ending in another type
    before[0] = 0.0
    after = other_type_min(B)
    after[n1 - 1] = 0.0
    return before.T[:, :, None] + cost + after.T[:, None, :]


class ExactScheduler(Scheduler):
    name = "exact"

    def __init__(self, seed: int = 0, time_limit: float | None = None):
        super().__init__(seed)
        self.time_limit = time_limit

    def search(self, cost_model: CostModel) -> Schedule:
        tables = cost_model.stage_tables()
        relaxed_cost, relaxed = dp_assignment(tables.cost)
        if relaxed is None:
            return Schedule(None, reason=no_plan_reason(cost_model), proven_optimal=True)
        first = cost_model.evaluate(relaxed)
        if first.feasible:
            return Schedule(relaxed, proven_optimal=True)
        return self._shared_limit_search(cost_model, tables, first)

    def _shared_limit_search(self, cost_model: CostModel, tables: StageTables, relaxed: Evaluation) -> Schedule:
        limits = cost_model.max_units.astype(float)
        singles = [[t] * cost_model.num_layers for t in range(cost_model.num_types)]
        incumbent: list[int] | tuple[int, ...] | None
        upper, incumbent = best_feasible(cost_model, singles)
        lower, best_multipliers = -np.inf, np.zeros(cost_model.num_types)
        multipliers = np.zeros(cost_model.num_types)
        scale = max(relaxed.cost_per_hour, 1e-12)
        for iteration in range(_LAGRANGE_ITERATIONS):
            value, assignment = dp_assignment(tables.cost + multipliers[:, None, None] * tables.units)
            if assignment is None:
                break
            bound = value - float(multipliers @ limits)
            if bound > lower:
                lower, best_multipliers = bound, multipliers.copy()
            evaluation = cost_model.evaluate(assignment)
            if evaluation.feasible and evaluation.cost_per_hour < upper:
                upper, incumbent = evaluation.cost_per_hour, list(evaluation.assignment)
            if incumbent is not None and upper - lower <= _TOLERANCE * max(abs(upper), 1.0):
                return Schedule(incumbent, proven_optimal=True)
            used = np.zeros(cost_model.num_types)
            for s in evaluation.stages:
                used[s.type_index] += s.units
            gradient = used - limits
            gradient[(multipliers <= 0) & (gradient < 0)] = 0.0
            norm = float(gradient @ gradient)
            if norm == 0:
                break
            gap = (upper - bound) if np.isfinite(upper) else 0.1 * scale
            step = (1.0 / (1 + iteration / 5)) * gap / norm
            multipliers = np.maximum(0.0, multipliers + step * gradient)
        return self._milp(cost_model, tables, upper, incumbent, best_multipliers, lower)

    def _milp(
        self,
        cost_model: CostModel,
        tables: StageTables,
        upper: float,
        incumbent: list[int] | tuple[int, ...] | None,
        multipliers: NDArray[np.float64],
        lower: float,
    ) -> Schedule:
        """The optimum over the candidates that can be in a plan cheaper than a cutoff.

        Per candidate, a lower bound on every feasible plan containing it (the DP's completion bound; with the
        multipliers, the Lagrangian one).  The MILP over the candidates bounded by a cutoff ``c`` holds every
        plan that costs at most ``c``: if its optimum costs at most ``c``, no plan is cheaper, proven.  The
        incumbent is such a cutoff, but often there is none, or a poor one, and nearly every candidate stays
        (77k on 200 layers x 64 types, a minute of HiGHS).  So the cutoffs are first guessed just above the
        Lagrangian bound ``lower`` (a few hundred candidates): a guess too low leaves an infeasible MILP or one
        whose optimum is above it (then an incumbent, the next cutoff), and the guess is raised."""
        bound = _completion_bounds(tables.cost)
        if multipliers.any():
            lagrangian = tables.cost + multipliers[:, None, None] * tables.units
            bound = np.maximum(bound, _completion_bounds(lagrangian) - float(multipliers @ cost_model.max_units))
        candidates = np.isfinite(tables.cost)
        best: list[int] | tuple[int, ...] | None = incumbent
        margins = iter(_CUTOFF_MARGINS)
        while True:
            margin = next(margins, None)
            cutoff = upper if margin is None else min(upper, lower + margin * max(abs(lower), 1e-12))
            final = cutoff >= upper  # every plan that could beat the incumbent (all plans, with none) is in
            slack = _TOLERANCE * max(abs(cutoff), 1.0) if np.isfinite(cutoff) else np.inf
            solved = self._solve(cost_model, tables, candidates & (bound <= cutoff + slack))
            if isinstance(solved, str):  # the solver stopped (time limit): the best known, not proven
                return Schedule(best, reason=None if best else f"MILP solver stopped: {solved}")
            if solved is not None:
                evaluation = cost_model.evaluate(solved)
                if evaluation.feasible and evaluation.cost_per_hour < upper:
                    upper, best = evaluation.cost_per_hour, solved
                if final or evaluation.cost_per_hour <= cutoff + slack:
                    return Schedule(best, proven_optimal=True)
            elif final:  # no plan beats the incumbent (or, with none, no plan at all)
                return Schedule(
                    best,
                    proven_optimal=True,
                    reason=None if best else no_plan_reason(cost_model) + " with shared units",
                )
            if solved is not None:  # a plan above the guess: its cost is the cutoff that settles it
                margins = iter(())

    def _solve(self, cost_model: CostModel, tables: StageTables, keep: NDArray[np.bool_]) -> list[int] | str | None:
        """The cheapest plan made of the ``keep`` candidates within the shared limits (0/1 MILP, zero gap);
        None when there is none, the solver's message when it stopped before proving either."""
        # Lazy: only a binding shared limit needs HiGHS, and scipy must not load in a process that imported
        # Paddle first (libpaddle's zlib symbols break scipy's import: docs/paddle-notes.md).
        from scipy.optimize import Bounds, LinearConstraint, milp
        from scipy.sparse import coo_matrix

        types, starts, ends = np.nonzero(keep)
        n, T = cost_model.num_layers, cost_model.num_types
        count = types.size
        if count == 0:
            return None
        rows: list[NDArray[np.intp]] = []
        cols: list[NDArray[np.intp]] = []
        vals: list[NDArray[np.float64]] = []
        lower_b: list[float] = []
        upper_b: list[float] = []
        columns = np.arange(count)

        def add_rows(
            row_ids: NDArray[np.intp],
            col_ids: NDArray[np.intp],
            coefficients: NDArray[np.float64],
            lo: Sequence[float],
            hi: Sequence[float],
        ) -> None:
            rows.append(row_ids)
            cols.append(col_ids)
            vals.append(coefficients)
            lower_b.extend(lo)
            upper_b.extend(hi)

        # Flow over boundaries 0..n: one path from 0 to n.
        add_rows(starts, columns, np.ones(count), [], [])
        add_rows(ends, columns, -np.ones(count), [], [])
        net = np.zeros(n + 1)
        net[0], net[n] = 1.0, -1.0
        lower_b.extend(net)
        upper_b.extend(net)
        row = n + 1
        # A stage is a maximal run: at a boundary, the stages on both sides have different types.
        side = np.concatenate([ends, starts]) * T + np.concatenate([types, types])
        inner = (np.concatenate([ends, starts]) > 0) & (np.concatenate([ends, starts]) < n)
        keys, inverse = np.unique(side[inner], return_inverse=True)
        add_rows(
            row + inverse,
            np.concatenate([columns, columns])[inner],
            np.ones(int(inner.sum())),
            [0.0] * keys.size,
            [1.0] * keys.size,
        )
        row += keys.size
        # Units of one type are shared by all its stages.
        add_rows(
            row + types, columns, tables.units[types, starts, ends], [0.0] * T, list(cost_model.max_units.astype(float))
        )
        row += T
        matrix = coo_matrix(
            (np.concatenate(vals), (np.concatenate(rows), np.concatenate(cols))), shape=(row, count)
        ).tocsr()
        options = {"mip_rel_gap": 0.0}
        if self.time_limit is not None:
            options["time_limit"] = self.time_limit
        with _stdout_to_stderr():
            result = milp(
                tables.cost[types, starts, ends],
                integrality=np.ones(count),
                bounds=Bounds(0, 1),
                constraints=[LinearConstraint(matrix, np.array(lower_b), np.array(upper_b))],
                options=options,
            )
        if result.status == 2:  # infeasible
            return None
        if result.x is None or result.status != 0:
            return str(result.message)
        assignment = [0] * n
        for c in np.flatnonzero(result.x > 0.5):
            assignment[starts[c] : ends[c]] = [int(types[c])] * (ends[c] - starts[c])
        return assignment


REACH_TOLERANCE = 0.01  # reachable_throughput's answer is within 1% below the true limit
# samples/s below any real target: a plan that cannot reach it cannot run the model at all (fits on no type)
_REACH_FLOOR = 1e-6


def reachable_throughput(cost_model_at: Callable[[float], CostModel], upper: float) -> float | None:
    """The most samples/s some plan reaches, searched up to ``upper`` (returned as is when a plan reaches it),
    within ``REACH_TOLERANCE`` below the true limit; None when no plan reaches even ``_REACH_FLOOR`` (the model
    fits on no type).  ``cost_model_at(t)``: the cost model with the same rules at throughput ``t``.

    What ``heterps plan`` tells a user whose target no plan meets.  A proven answer, so exact's: a plan exists at
    ``t`` iff exact finds one, and raising ``t`` never lowers a stage's units, so feasibility only falls as ``t``
    rises and a bisection (over log ``t``: targets span decades) finds the limit in a dozen or so searches."""

    def feasible(throughput: float) -> bool:
        return ExactScheduler().search(cost_model_at(throughput)).assignment is not None

    if feasible(upper):
        return upper
    low, high = min(_REACH_FLOOR, upper / 2), upper
    if not feasible(low):
        return None
    return highest_target(feasible, low, high, REACH_TOLERANCE)


@contextlib.contextmanager
def _stdout_to_stderr() -> Iterator[None]:
    """HiGHS (C++) sometimes prints diagnostics to file descriptor 1 even with display off; `heterps plan
    --json` promises exactly one JSON object on stdout, so the solver's output goes to stderr instead."""
    try:
        stdout_fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # no real stdout (captured): nothing to protect
        yield
        return
    sys.stdout.flush()
    saved = os.dup(stdout_fd)
    try:
        os.dup2(sys.stderr.fileno() if hasattr(sys.stderr, "fileno") else os.open(os.devnull, os.O_WRONLY), stdout_fd)
        yield
    finally:
        sys.stdout.flush()
        os.dup2(saved, stdout_fd)
        os.close(saved)


SCHEDULER = ExactScheduler
