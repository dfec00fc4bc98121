"""``greedy``: layers in program order, each given the type that makes the plan cheapest when the layers
not yet decided follow it (the layer-by-layer greedy placement the HeterPS paper compares with)."""

from __future__ import annotations

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.schedulers.base import Schedule, Scheduler, no_plan_reason


class GreedyScheduler(Scheduler):
    name = "greedy"

    def search(self, cost_model: CostModel) -> Schedule:
        n, T = cost_model.num_layers, cost_model.num_types
        decided: list[int] = []
        for layer in range(n):
            best_key, best_type = None, 0
            for t in range(T):
                evaluation = cost_model.evaluate(decided + [t] * (n - layer))
                # Feasible plans first, then cheapest; infeasible ones by how far over the limits they are.
                key = (not evaluation.feasible, evaluation.excess_units, evaluation.cost_per_hour)
                if best_key is None or key < best_key:
                    best_key, best_type = key, t
            decided.append(best_type)
        final = cost_model.evaluate(decided)
        if not final.feasible:
            return Schedule(None, reason=no_plan_reason(cost_model) + " (greedy found none)")
        return Schedule(decided)


SCHEDULER = GreedyScheduler
