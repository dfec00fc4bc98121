"""``brute``: every assignment, for checking ``exact`` on small models (refuses more than 10^6 plans)."""

from __future__ import annotations

import itertools

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import PlanningInputError
from heterps_paddle.planning.schedulers.base import Schedule, Scheduler, best_feasible, no_plan_reason

MAX_ASSIGNMENTS = 10**6


class BruteScheduler(Scheduler):
    name = "brute"

    def search(self, cost_model: CostModel) -> Schedule:
        count = cost_model.num_types**cost_model.num_layers
        if count > MAX_ASSIGNMENTS:
            raise PlanningInputError(
                f"brute force refuses {cost_model.num_types}^{cost_model.num_layers} = {count:.3g} assignments "
                f"(limit {MAX_ASSIGNMENTS:.0e}); use --scheduler exact"
            )
        _, best = best_feasible(
            cost_model, itertools.product(range(cost_model.num_types), repeat=cost_model.num_layers)
        )
        return Schedule(best, reason=None if best else no_plan_reason(cost_model), proven_optimal=True)


SCHEDULER = BruteScheduler
