"""The one scheduler interface: a scheduler maps a cost model (profile + cluster + throughput) to an
assignment of a resource type per layer. Timing, evaluation counting and the plan record are done here, once,
so every scheduler is measured the same way."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Iterable, Sequence

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Plan


@dataclass(frozen=True)
class Schedule:
    assignment: Sequence[int] | None  # type index per layer; None when nothing feasible was found
    reason: str | None = None  # why there is no (feasible) plan
    refined_from_cost: float | None = None  # rl: cost before the local refinement of its best sample
    proven_optimal: bool = False


class Scheduler(ABC):
    name: str = ""

    def __init__(self, seed: int = 0):
        self.seed = seed

    @abstractmethod
    def search(self, cost_model: CostModel) -> Schedule:
        """Find an assignment; evaluate candidates only through ``cost_model``."""

    def plan(self, cost_model: CostModel) -> Plan:
        evaluations_before = cost_model.evaluations
        started = time.perf_counter()
        result = self.search(cost_model)
        seconds = time.perf_counter() - started
        evaluations = cost_model.evaluations - evaluations_before
        return cost_model.to_plan(
            result.assignment,
            self.name,
            search_seconds=seconds,
            evaluations=evaluations,
            reason=result.reason,
            refined_from_cost=result.refined_from_cost,
        )


def best_feasible(cost_model: CostModel, candidates: Iterable[Sequence[int]]) -> tuple[float, tuple[int, ...] | None]:
    """Cheapest feasible assignment among ``candidates`` (iterable of assignments)."""
    best_cost, best = float("inf"), None
    for assignment in candidates:
        evaluation = cost_model.evaluate(assignment)
        if evaluation.feasible and evaluation.cost_per_hour < best_cost:
            best_cost, best = evaluation.cost_per_hour, evaluation.assignment
    return best_cost, best


def no_plan_reason(cost_model: CostModel) -> str:
    return (
        f"no assignment of the {cost_model.num_layers} layers to the {cost_model.num_types} resource types "
        f"reaches {cost_model.throughput:g} samples/s within max_units"
    )
