"""A new round's plan and files: what the coordinator asks for when the machine says Replan (launch/machine.py), and
what a host writes for the round it joins.

Re-planning is planning/replan.py's (the same scheduler and target on the hosts left); this module only finds the
running plan, asks for the next one when the hosts changed, writes it with the one plan writer
(planning/model.py: ``save_plan``) and says what changed for restarts.json.
"""

from __future__ import annotations

import json
import os
from typing import Any, Callable, Mapping

from heterps_paddle.errors import HeterPSError
from heterps_paddle.launch.hosts import HostRound, RoundFiles, host_round, job_for_round
from heterps_paddle.launch.job import RoundPlan, RoundRequest
from heterps_paddle.launch.options import LaunchOptions
from heterps_paddle.launch.placement import Expansion
from heterps_paddle.planning.hosts import joined_hosts, joined_spec, with_joined
from heterps_paddle.planning.model import Plan, plan_from_dict, save_plan


def plan_maker(part: HostRound, log_dir: str) -> Callable[[RoundRequest], RoundPlan]:
    """The coordinator's re-planning: the plan for the hosts the job has, written beside the coordinator's logs."""
    from heterps_paddle.planning.replan import PlanningInputs, better, replan

    first = part.expansion
    given = part.options.hosts
    assert given is not None

    def next_round(request: RoundRequest) -> RoundPlan:
        published = request.published
        inputs = published.get("inputs")
        if published.get("plan"):
            old = plan_from_dict(published["plan"], "the job's published plan")
        elif request.plan_now is not None:
            old = plan_from_dict(request.plan_now, "the round's plan")
        else:
            old = first.plan
        hosts = with_joined(first.hosts, joined_hosts(request.joined))
        lost_changed = request.lost != request.lost_before
        if lost_changed and inputs is None:
            raise HeterPSError(
                "the job published no planning inputs to re-plan with (the automatic path, "
                "heterps_configs['cluster'], publishes them)"
            )
        if inputs is not None and (lost_changed or frozenset(request.joined) != request.joined_before):
            planning = PlanningInputs.from_dict(inputs)
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
        return RoundPlan(document, again, report, better_plan)

    return next_round


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
