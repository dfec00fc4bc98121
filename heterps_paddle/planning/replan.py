"""A new plan for the hosts a job has left (``heterps launch --hosts ... --restarts N``, launch/coordinator.py).

When a host is lost, its units are gone: the cluster the job may use is the hosts file's machines less the lost
ones, each type capped at the units its remaining hosts have (a type with no host left is gone).  The new plan is
the same scheduler's cheapest plan at the same target on that cluster; when the target is out of reach, the most
samples/s the remaining units reach (exact's proven limit, as ``heterps plan`` reports it), or, with a budget, the
fastest plan within it.

Pure Python, no Paddle.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from heterps_paddle.planning.hosts import HostsFile
from heterps_paddle.planning.model import (
    RESOURCE_KINDS,
    Cluster,
    ModelProfile,
    Plan,
    PlanningInputError,
    cluster_from_dict,
    cluster_to_dict,
    model_profile_from_dict,
    model_profile_to_dict,
)
from heterps_paddle.planning.planner import budget_plan, launchable_cost_model, make_plans
from heterps_paddle.planning.schedulers.exact import REACH_TOLERANCE, reachable_throughput


@dataclass(frozen=True)
class PlanningInputs:
    """What the plan a job runs was made from: enough to make another for fewer units."""

    profile: ModelProfile
    cluster: Cluster
    target: float | None
    budget: float | None
    scheduler: str
    seed: int
    trainer_kinds: tuple[str, ...] = RESOURCE_KINDS

    @property
    def target_throughput(self) -> float | None:
        """The samples/s the plan had to reach: the job's target, else the cluster file's (None: neither)."""
        return self.target if self.target is not None else self.cluster.throughput

    def to_dict(self) -> dict[str, Any]:
        return {
            "profile": model_profile_to_dict(self.profile),
            "cluster": cluster_to_dict(self.cluster),
            "target": self.target,
            "budget": self.budget,
            "scheduler": self.scheduler,
            "seed": self.seed,
            "trainer_kinds": list(self.trainer_kinds),
        }

    @staticmethod
    def from_dict(value: Mapping[str, Any]) -> PlanningInputs:
        return PlanningInputs(
            profile=model_profile_from_dict(value["profile"], "the job's published profile"),
            cluster=cluster_from_dict(value["cluster"], "the job's published cluster"),
            target=value.get("target"),
            budget=value.get("budget"),
            scheduler=str(value["scheduler"]),
            seed=int(value["seed"]),
            trainer_kinds=tuple(value.get("trainer_kinds") or RESOURCE_KINDS),
        )


@dataclass(frozen=True)
class Replanned:
    plan: Plan
    cluster: Cluster  # the remaining units
    note: str  # how the plan was chosen (the target met, or the most the remaining units reach)


def remaining_cluster(cluster: Cluster, hosts: HostsFile, lost: Iterable[str]) -> Cluster:
    """``cluster`` limited to the units of the hosts not in ``lost``."""
    gone = set(lost)
    units: dict[str, int] = {}
    for host in hosts.hosts:
        if host.address not in gone:
            units[host.type] = units.get(host.type, 0) + host.units
    kept = tuple(
        dataclasses.replace(t, max_units=min(t.max_units, units[t.name]))
        for t in cluster.resource_types
        if units.get(t.name, 0) > 0
    )
    if not kept:
        raise PlanningInputError(f"no host is left of the hosts file {hosts.source} once {sorted(gone)} are lost")
    return dataclasses.replace(cluster, resource_types=kept)


def replan(inputs: PlanningInputs, hosts: HostsFile, lost: Iterable[str]) -> Replanned:
    """The plan for the hosts left (module doc); PlanningInputError when no plan runs the model on them."""
    lost = sorted(set(lost))
    cluster = remaining_cluster(inputs.cluster, hosts, lost)
    kinds = inputs.trainer_kinds
    if inputs.budget is not None:
        answer = budget_plan(inputs.profile, cluster, inputs.budget, inputs.scheduler, inputs.seed, kinds)
        if not answer.plan.feasible:
            raise PlanningInputError(f"no plan within the budget on the hosts left: {answer.plan.reason}")
        return Replanned(answer.plan, cluster, f"the fastest within the budget of {inputs.budget}/h")
    target = inputs.target_throughput
    if target is not None:
        ((_, plan),) = make_plans(inputs.profile, cluster, inputs.scheduler, [target], inputs.seed, kinds)
        if plan.feasible:
            return Replanned(plan, cluster, f"the cheapest at the target of {target:,.0f} samples/s")
    upper = target if target is not None else 1e12
    reach = reachable_throughput(
        lambda throughput: launchable_cost_model(inputs.profile, cluster, throughput, kinds), upper
    )
    if reach is None:
        raise PlanningInputError(
            f"no plan runs the model on the hosts left ({', '.join(cluster.type_names())}) at any throughput"
        )
    at = reach * (1 - REACH_TOLERANCE)
    ((_, plan),) = make_plans(inputs.profile, cluster, inputs.scheduler, [at], inputs.seed, kinds)
    if not plan.feasible:
        raise PlanningInputError(f"no plan on the hosts left: {plan.reason}")
    if target is None:
        return Replanned(plan, cluster, f"no target: the most the hosts it has reach, {at:,.0f} samples/s")
    return Replanned(
        plan,
        cluster,
        f"the target of {target:,.0f} samples/s is out of reach: the most the hosts it has reach, {at:,.0f}",
    )


# Plans within this fraction of each other (cost or samples/s) are the same: a move stops and restarts the whole job,
# which only a real gain pays for.
BETTER_MARGIN = 0.01


def better(new: Plan, old: Plan, target: float | None) -> bool:
    """Whether moving a running job from ``old`` to ``new`` gains: at a target, meeting it where ``old`` does not,
    or meeting it for less; otherwise (neither meets it, or no target) more samples/s."""
    if not new.feasible:
        return False
    if not old.feasible:
        return True
    if target is not None:
        reach = target * (1 - REACH_TOLERANCE)
        new_meets, old_meets = new.throughput >= reach, old.throughput >= reach
        if new_meets != old_meets:
            return new_meets
        if new_meets:
            return new.cost_per_hour < old.cost_per_hour * (1 - BETTER_MARGIN)
    return new.throughput > old.throughput * (1 + BETTER_MARGIN)
