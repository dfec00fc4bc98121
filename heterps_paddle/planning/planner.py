"""The ``heterps plan`` engine: plans from a profile and a cluster under the runtime's rules, the cheapest plan
per target or the fastest within a budget, and what to tell a user whose target no plan meets.

The command (tools/plan_command.py) parses its options into these arguments and prints what comes back; the
rules live here, below the CLI, so anything that plans from files (a benchmark, a test, the automatic path's
advice through the command) gets the same plans.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from heterps_paddle.planning.budget import fastest_within_budget
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.launch import SPLIT_FIRST_STAGE_KINDS
from heterps_paddle.planning.model import RESOURCE_KINDS, Cluster, ModelProfile, Plan
from heterps_paddle.planning.schedulers import make_scheduler
from heterps_paddle.planning.schedulers.exact import REACH_TOLERANCE, reachable_throughput


def launchable_cost_model(
    profile: ModelProfile, cluster: Cluster, throughput: float | None, trainer_kinds: tuple[str, ...]
) -> CostModel:
    """The cost model with the runtime's rules (a split plan's first stage runs on the CPU trainers and holds every
    lookup; what the trainers of a one-stage plan can be), so the plan can be launched."""
    return CostModel(
        profile,
        cluster,
        throughput,
        first_stage_kinds=SPLIT_FIRST_STAGE_KINDS,
        one_stage_kinds=trainer_kinds,
        lookups_first=True,
    )


def make_plans(
    profile: ModelProfile,
    cluster: Cluster,
    scheduler: str,
    throughputs: list[float | None],
    seed: int = 0,
    trainer_kinds: tuple[str, ...] = RESOURCE_KINDS,
) -> list[tuple[CostModel, Plan]]:
    """The cheapest launchable plan per target (None: the cluster file's), each with its cost model."""
    results = []
    for throughput in throughputs:
        cost_model = launchable_cost_model(profile, cluster, throughput, trainer_kinds)
        results.append((cost_model, make_scheduler(scheduler, seed=seed).plan(cost_model)))
    return results


def infeasible_lines(
    results: list[tuple[CostModel, Plan]], scheduler: str, trainer_kinds: tuple[str, ...]
) -> list[str]:
    """One line per target no plan meets: the target, why, and what is reachable (exact's answer, so a user
    knows whether to lower the target, change the cluster, or try another scheduler)."""
    missed = [(cost_model, plan) for cost_model, plan in results if not plan.feasible]
    if not missed:
        return []
    profile, cluster = missed[0][0].profile, missed[0][0].cluster
    reachable = reachable_throughput(
        lambda throughput: launchable_cost_model(profile, cluster, throughput, trainer_kinds),
        max(cost_model.throughput for cost_model, _ in missed),
    )
    lines = []
    for cost_model, plan in missed:
        target = cost_model.throughput
        if reachable is None:
            reach = "no plan runs the model on this cluster at any throughput"
        elif reachable >= target:
            reach = f"the exact scheduler finds one (--scheduler exact); {scheduler} did not"
        else:
            reach = (
                f"the most any plan reaches on this cluster is about {math.floor(reachable):,} samples/s "
                f"(exact, within {REACH_TOLERANCE:.0%})"
            )
        shown = f"{target:,.0f}" if target < 1e15 else f"{target:.3g}"  # not 300 digits for --throughput 1e300
        lines.append(f"no plan meets the target of {shown} samples/s: {plan.reason}; {reach}")
    return lines


@dataclass(frozen=True)
class BudgetPlan:
    """The fastest plan within a price (``budget_per_hour`` set), the cost model to show it against, and how many
    searches over the target it took."""

    cost_model: CostModel
    plan: Plan
    searches: int


def budget_plan(
    profile: ModelProfile,
    cluster: Cluster,
    budget: float,
    scheduler: str,
    seed: int = 0,
    trainer_kinds: tuple[str, ...] = RESOURCE_KINDS,
) -> BudgetPlan:
    """The fastest launchable plan within ``budget`` per hour.  Shown against the plan's own samples/s: the
    single-type lines then say what the same speed costs on one type (the search's last target can sit far below
    what its plan gives)."""
    answer = fastest_within_budget(
        budget,
        lambda throughput: launchable_cost_model(profile, cluster, throughput, trainer_kinds),
        make_scheduler(scheduler, seed=seed).plan,
    )
    plan = replace(answer.plan, budget_per_hour=budget)
    shown = answer.cost_model
    if plan.feasible:
        shown = launchable_cost_model(profile, cluster, plan.throughput, trainer_kinds)
    return BudgetPlan(shown, plan, answer.searches)
