"""A new round's plan and files: what the coordinator asks for when the machine says Replan (launch/machine.py), and
what a host writes for the round it joins.

Re-planning is planning/replan.py's (the exact scheduler, the same target, on the hosts left); this module only finds the
running plan, asks for the next one when the hosts changed, writes it with the one plan writer
(planning/model.py: ``save_plan``) and says what changed for restarts.json.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from typing import Any, Callable, Mapping, Sequence

from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch.events import Proposal
from heterps_paddle.launch.hosts import HostRound, RoundFiles, host_round, job_for_round
from heterps_paddle.launch.job import RoundPlan, RoundRequest
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.placement import Expansion, expand
from heterps_paddle.planning.hosts import HostsFile, joined_hosts, joined_spec, with_joined, without_hosts
from heterps_paddle.planning.model import Cluster, ModelProfile, Plan, plan_from_dict, save_plan
from heterps_paddle.planning.refit import Refit, combine, corrected_profile, from_rates, predicted, rate_of
from heterps_paddle.planning.schedulers.exact import REACH_TOLERANCE
from heterps_paddle.planning.unit_cost import cost_per_million_samples


def plan_maker(part: HostRound, log_dir: str) -> Callable[[RoundRequest], RoundPlan]:
    """The coordinator's re-planning: the plan for the hosts the job has, written beside the coordinator's logs."""
    from heterps_paddle.planning.replan import better, replan

    first = part.expansion
    given = part.options.hosts
    assert given is not None

    def next_round(request: RoundRequest) -> RoundPlan:
        published = request.published
        inputs = published.get("inputs")
        old = _running_plan(request, first.plan)
        hosts = with_joined(first.hosts, joined_hosts(request.joined))
        released: dict[str, float] = {}
        lost_changed = request.lost != request.lost_before
        if request.decided is not None:  # the move the machine decided (launch/machine.py): its plan, as decided
            new = plan_from_dict(request.decided.plan, "the plan the measured rates decided")
            how, better_plan = "the plan the measured rates decided", True
            released = dict(request.decided.released)
        elif request.adapt and inputs is not None:
            # a slow host's replacement: the best plan on the corrected model for the hosts it has now
            # (the machine decided the replacement: the plan is not judged again)
            planning = launch_planning(inputs, request.refit)
            running = running_rate(old, planning, request.refit)
            new = best_on_measurements(planning, hosts, request.lost, request.refit, running)
            how, better_plan = "the best plan on the measured rates", True
            released = released_hosts(new, hosts, request.lost, planning.cluster, part.address, given.server_num)
        elif lost_changed and inputs is None:
            raise HeterPSError(
                "the job published no planning inputs to re-plan with (the automatic path, "
                "heterps_configs['cluster'], publishes them)"
            )
        elif inputs is not None and (lost_changed or frozenset(request.joined) != request.joined_before):
            planning = launch_planning(inputs, request.refit)
            replanned = replan(planning, hosts, request.lost)
            new, how = replanned.plan, replanned.note
            better_plan = better(new, old, planning.target_throughput)
        else:
            # the same hosts (or only machines joined to a job that cannot re-plan): the same plan, no move for it
            new, how, better_plan = old, "the same plan (the same hosts)", False
        path = os.path.join(log_dir, f"plan.round{request.number}.coordinator.json")
        save_plan(new, path)
        again = job_for_round(given, RoundFiles.after(first, path, request.lost, request.joined), part.address)
        report = {
            "old_plan": plan_summary(old),
            "new_plan": plan_summary(new),
            "how": how,
            "summary": f"{describe_plan(old)} -> {describe_plan(new)} ({how})",
            "new_summary": describe_plan(new),
        }
        with open(path, encoding="utf-8") as f:
            document = json.load(f)
        plan_from_dict(document)  # what every host reads back
        return RoundPlan(document, again, report, better_plan, released)

    return next_round


def _running_plan(request: RoundRequest, first: Plan) -> Plan:
    """The plan the round that ends runs: the one trainer 0 published, else the round's file, else the first's."""
    if request.published.get("plan"):
        return plan_from_dict(request.published["plan"], "the job's published plan")
    if request.plan_now is not None:
        return plan_from_dict(request.plan_now, "the round's plan")
    return first


def running_rate(plan: Plan, planning: Any, refit: Refit | None) -> float:
    """What the running ``plan`` trains on the corrected model (its units as they are)."""
    return predicted(replace(plan, throughput=rate_of(plan, planning.profile, planning.cluster)), refit)


def best_on_measurements(
    planning: Any, hosts: HostsFile, lost: frozenset[str], refit: Refit | None, running: float | None = None
) -> Plan:
    """The plan the measured rates say is best for the hosts the job has: the scheduler's on the corrected model,
    and one stage on each type the hosts have (a pipeline pays the factor no stage explained: planning/refit.py,
    which the scheduler does not know), each at its predicted samples/s.  Under a budget the fastest within it; at
    a target the cheapest that meets it, else the fastest; with neither (the job's objective is then its cost per
    sample) the cheapest per sample of those that train at least ``running`` samples/s (the running plan's, on
    the same model), else the cheapest per sample."""
    from heterps_paddle.planning.replan import remaining_cluster, replan

    candidates = [replan(planning, hosts, lost).plan]
    if planning.target_throughput is None and planning.budget is None and running:
        # the cost per sample objective: the cheapest plan that trains at least as fast as the running one
        candidates.append(replan(replace(planning, target=running), hosts, lost).plan)
    for rtype in remaining_cluster(planning.cluster, hosts, lost).resource_types:
        alone = replace(planning.cluster, resource_types=(rtype,))
        try:
            candidates.append(replan(replace(planning, cluster=alone), hosts, lost).plan)
        except HeterPSError:
            continue  # that type cannot run the model alone
    plans = [replace(p, throughput=predicted(p, refit)) for p in candidates if p.feasible]
    target = planning.target_throughput
    if planning.budget is not None:
        within = [p for p in plans if p.cost_per_hour <= planning.budget * (1 + 1e-9)] or plans
        return max(within, key=lambda p: (p.throughput, -p.cost_per_hour))
    if target is None:
        fast = [p for p in plans if running is None or p.throughput >= running * (1 - REACH_TOLERANCE)] or plans
        return min(fast, key=lambda p: (per_sample(p), -p.throughput))
    meeting = [p for p in plans if p.throughput >= target * (1 - REACH_TOLERANCE)]
    if meeting:
        return min(meeting, key=lambda p: (p.cost_per_hour, -p.throughput))
    return max(plans, key=lambda p: (p.throughput, -p.cost_per_hour))


def per_sample(plan: Plan) -> float:
    """What a million samples cost on ``plan``, at its predicted samples/s (infinite when it trains nothing)."""
    return cost_per_million_samples(plan.cost_per_hour, plan.throughput)


# The launch's re-plans (a lost host's, a move's, every reconsideration's) use the exact scheduler: they run on the
# coordinator's host beside the job's training, as often as every reconsideration, and exact is the optimum of the
# same cost model the rl scheduler is judged against.  With rl, a proposal under a budget (a search over targets,
# a policy trained at each) took 46 s of CPU on this 2-core machine, against 1 s; the configured scheduler
# (heterps_configs['scheduler']) makes the first plan's advice in the plan report.
REPLAN_SCHEDULER = "exact"


def launch_planning(inputs: Mapping[str, Any], refit: Refit | None) -> Any:
    """The job's published planning inputs as the launch re-plans with them: the exact scheduler, the profile
    corrected by ``refit`` when there is one."""
    from heterps_paddle.planning.replan import PlanningInputs

    return corrected(replace(PlanningInputs.from_dict(inputs), scheduler=REPLAN_SCHEDULER), refit)


def corrected(inputs: Any, refit: Refit | None) -> Any:
    """The planning inputs with the profile the measured rates corrected (planning/refit.py), when there are any."""
    if refit is None:
        return inputs
    return replace(inputs, profile=corrected_profile(inputs.profile, refit))


def released_hosts(
    plan: Plan, hosts: HostsFile, lost: frozenset[str], cluster: Cluster, coordinator: str, server_num: int | None
) -> dict[str, float]:
    """The hosts of the job (less the lost) that ``plan`` runs nothing on, but the coordinator's: what each costs an
    hour (its units at its type's price).  They are let go when the job moves to it."""
    left = without_hosts(hosts, lost)
    expansion = expand(plan, left, {t.name: t.kind for t in cluster.resource_types}, server_num, gpu=False)
    running = {p.host.address for p in expansion.parts if p.processes}
    prices = {t.name: t.price_per_hour for t in cluster.resource_types}
    return {
        h.address: h.units * prices.get(h.type, 0.0)
        for h in left.hosts
        if h.address not in running and h.address != coordinator
    }


def proposer(part: HostRound) -> Callable[[RoundRequest, Sequence[Mapping[str, Any]], str], Proposal | None]:
    """The coordinator's answer to Reconsider (launch/machine.py): another plan for the hosts the job has, on the
    cost model its measured windows (``rates`` records) correct, beside the running plan on the same model; what it
    lets go, and what more units a plan meeting a missed target needs (docs/adaptive.md)."""
    first = part.expansion
    given = part.options.hosts
    assert given is not None

    def propose(request: RoundRequest, windows: Sequence[Mapping[str, Any]], why: str) -> Proposal | None:
        inputs = request.published.get("inputs")
        if inputs is None:
            raise HeterPSError("the job published no planning inputs to plan again with (heterps_configs['cluster'])")
        published = launch_planning(inputs, None)
        old = _running_plan(request, first.plan)
        found = (from_rates(old, w, published.profile, published.cluster) for w in windows)
        refits = [r for r in found if r is not None]
        if not refits:
            return None
        refit = combine(refits).merged(request.refit)
        planning = corrected(published, refit)
        hosts = with_joined(first.hosts, joined_hosts(request.joined))
        target = planning.target_throughput
        current_rate = running_rate(old, planning, refit)
        new = best_on_measurements(planning, hosts, request.lost, refit, current_rate)
        meets = target is None or new.throughput >= target * (1 - REACH_TOLERANCE)
        wanted: dict[str, int] = {}
        if not meets and target is not None:
            wanted = _units_wanted(planning, hosts, request.lost, target)
        return Proposal(
            plan=new.to_dict(),
            summary=f"{describe_plan(old)} -> {describe_plan(new)}",
            samples_per_s=new.throughput,
            cost_per_hour=new.cost_per_hour,
            meets_target=meets,
            current_samples_per_s=current_rate,
            current_cost_per_hour=old.cost_per_hour,
            target=target,
            budget=planning.budget,
            released=released_hosts(new, hosts, request.lost, planning.cluster, part.address, given.server_num),
            wanted=wanted,
            refit={**refit.to_dict(), "windows": len(refits)},
            why=why,
            same=_stages(new) == _stages(old),
            correction=refit,
            from_file=never_measured(new, published.profile, refit),
        )

    return propose


def never_measured(plan: Plan, profile: ModelProfile, refit: Refit | None) -> tuple[str, ...]:
    """The resource types ``plan`` puts a layer on that the job never measured it on: no time of the published
    profile (the launch's own measurement, a host's type timed before the plan) and none the windows corrected."""
    measured = {(layer.name, rtype) for layer in profile.layers for rtype in layer.time}
    if refit is not None:
        measured |= set(refit.times)
    found = [s.resource for s in plan.stages if any((layer, s.resource) not in measured for layer in s.layers)]
    return tuple(sorted(set(found)))


def _stages(plan: Plan) -> list[tuple[str, tuple[str, ...], int]]:
    return [(s.resource, tuple(s.layers), s.units) for s in plan.stages]


def _units_wanted(planning: Any, hosts: HostsFile, lost: frozenset[str], target: float) -> dict[str, int]:
    """The units of each type the cheapest plan meeting ``target`` needs beyond those the job's hosts have (the
    cluster file's limits, not the hosts'); {} when no plan meets it even so."""
    from heterps_paddle.planning.planner import make_plans

    ((_, plan),) = make_plans(
        planning.profile, planning.cluster, "exact", [target], planning.seed, planning.trainer_kinds
    )
    if not plan.feasible:
        return {}
    have: dict[str, int] = {}
    for h in without_hosts(hosts, lost).hosts:
        have[h.type] = have.get(h.type, 0) + h.units
    need: dict[str, int] = {}
    for stage in plan.stages:
        need[stage.resource] = need.get(stage.resource, 0) + stage.units
    return {t: n - have.get(t, 0) for t, n in sorted(need.items()) if n > have.get(t, 0)}


def part_of_round(
    options: LaunchOptions,
    first: Expansion,
    log_dir: str,
    number: int,
    plan: Mapping[str, Any],
    lost: frozenset[str],
    environ: Mapping[str, str],
    joined: Mapping[str, Mapping[str, Any]] | None = None,
) -> HostRound:
    """This host's part of round ``number`` of the job whose first round ``first`` placed: ``plan`` (the
    coordinator's document) written beside this host's logs, with the machines ``joined`` from outside the hosts
    file and without the ``lost`` hosts."""
    plan_path = os.path.join(log_dir, f"plan.round{number}.json")
    save_plan(plan_from_dict(plan, f"round {number}'s plan from the coordinator"), plan_path)
    return host_round(options, environ, RoundFiles.after(first, plan_path, lost, joined))


def joined_of(message: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The machines from outside the hosts file, as the coordinator's restart or round answer lists them (checked:
    planning/hosts.py: joined_spec)."""
    joined = {}
    for item in message.get("joined") or ():
        if not isinstance(item, Mapping) or not isinstance(item.get("address"), str):
            raise HeterPSError(f"the coordinator's list of joined machines has a bad entry: {item!r:.120}")
        spec = {k: v for k, v in item.items() if k != "address"}
        joined[item["address"]] = joined_spec(item["address"], spec, "the coordinator's joined machines")
    return joined


def plan_summary(plan: Plan) -> dict[str, Any]:
    """A plan as restarts.json reports it."""
    return {
        "stages": [
            f"{s.units} x {s.resource} ({len(s.layers)} layer{'s' * (len(s.layers) != 1)})" for s in plan.stages
        ],
        "cost_per_hour": round(plan.cost_per_hour, 4),
        "predicted_samples_per_s": round(plan.throughput, 1),
    }


def describe_plan(plan: Plan) -> str:
    stages = " | ".join(f"{s.units} x {s.resource}" for s in plan.stages)
    return f"{stages} ({plan.cost_per_hour:.3g}/h, {plan.throughput:,.0f} samples/s predicted)"
