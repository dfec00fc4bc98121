"""Budget mode: given a price per hour instead of a throughput target, the plan with the most samples/s whose
cost stays within it.  Users often have a budget, not a target.

Any scheduler answers "the cheapest plan that meets a target"; this turns that into "the fastest plan within a
budget" by searching the target.  For a proven optimum (``exact``) the answer is exact up to ``BUDGET_TOLERANCE``:
a plan that meets a target meets every lower one, so the least cost over plans can only rise with the target, and
"some plan meets t within the budget" is true up to a limit and false above it.  The search doubles the target
(jumping to twice what the last plan achieved, since a plan often beats its target) until the cost passes the
budget, then bisects over log throughput (planning/target_search.py) between the last target that fitted and the
first that did not.  With
``rl`` the same search runs on its (near-optimal) plans, so the answer is as close as rl's plans are.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Callable

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Plan
from heterps_paddle.planning.target_search import highest_target

BUDGET_TOLERANCE = 1e-3  # relative: the answer is within 0.1% of the most samples/s the budget buys
# Where the search starts (samples/s): a plan for it is the cheapest plan there is (one unit a stage); a target
# is bounded above so that a cluster without unit limits cannot make the doubling run forever.
_START_THROUGHPUT = 1.0
_MAX_THROUGHPUT = 1e15


def within_budget(cost_per_hour: float, budget: float) -> bool:
    """Whether a plan's price keeps a budget (the sum of stage prices may round a hair above an equal budget)."""
    return cost_per_hour <= budget * (1 + 1e-12)


@dataclass(frozen=True)
class BudgetAnswer:
    """The fastest plan within ``budget`` (its cost model is the one it was provisioned under), or an infeasible
    plan saying why no plan fits; ``searches``: how many plans the search made."""

    budget: float
    cost_model: CostModel
    plan: Plan
    searches: int


def fastest_within_budget(
    budget: float, cost_model_at: Callable[[float], CostModel], schedule: Callable[[CostModel], Plan]
) -> BudgetAnswer:
    """``cost_model_at(t)``: the cost model at throughput ``t`` (same profile, cluster and rules);
    ``schedule``: the scheduler's plan for a cost model (the cheapest plan meeting its target)."""
    if not (budget > 0 and math.isfinite(budget)):
        raise ValueError(f"budget must be a positive finite price per hour, got {budget!r}")
    searches = 0

    def plan_at(target: float) -> tuple[CostModel, Plan]:
        nonlocal searches
        searches += 1
        cost_model = cost_model_at(target)
        return cost_model, schedule(cost_model)

    def fits(plan: Plan) -> bool:
        return plan.feasible and within_budget(plan.cost_per_hour, budget)

    low = _START_THROUGHPUT
    best_model, best = plan_at(low)
    if not best.feasible:
        return BudgetAnswer(budget, best_model, best, searches)
    if not fits(best):
        reason = (
            f"no plan fits a budget of {budget:.4g}/h: the cheapest plan that runs the model costs "
            f"{best.cost_per_hour:.4g}/h"
        )
        return BudgetAnswer(budget, best_model, replace(best, feasible=False, reason=reason), searches)

    def within(target: float) -> bool:
        # Every plan that fits is kept if it achieves more (a plan may overshoot its target).
        nonlocal best_model, best
        model, plan = plan_at(target)
        if fits(plan) and plan.throughput > best.throughput:
            best_model, best = model, plan
        return fits(plan)

    # Grow until a target's cheapest plan no longer fits (or no plan meets it), then bisect below it.
    while True:
        target = min(_MAX_THROUGHPUT, 2.0 * max(low, best.throughput))
        if target <= low:  # at the cap and still within the budget: the budget is not what binds
            return BudgetAnswer(budget, best_model, best, searches)
        if not within(target):
            break
        low = target
    highest_target(within, low, target, BUDGET_TOLERANCE)
    return BudgetAnswer(budget, best_model, best, searches)
