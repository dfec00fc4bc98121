"""Plans in words: the ``heterps plan`` summary, and the report the automatic path writes for a job.

The job's report leads with what runs (stages, processes as launched, predicted samples/s and cost, whether the
target is met), then what another launch would give and what it would need, then the single-type alternatives
at the same target, then the measured inputs.  Pure Python.
"""

from __future__ import annotations

from dataclasses import dataclass

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.launch import shape_of
from heterps_paddle.planning.launch_fit import THROUGHPUT_TIE, LaunchFit
from heterps_paddle.planning.model import RESOURCE_KINDS, Cluster, Plan, Stage


def _cheapest_single_type(cost_model: CostModel, kinds: tuple[str, ...], scheduler: str) -> Plan | None:
    """The cheapest feasible plan that runs every layer on one type of one of ``kinds``."""
    best = None
    for evaluation, rtype in zip(cost_model.single_type_evaluations(), cost_model.types):
        if (
            rtype.kind in kinds
            and evaluation.feasible
            and (best is None or evaluation.cost_per_hour < best.cost_per_hour)
        ):
            best = evaluation
    return None if best is None else cost_model.to_plan(best.assignment, scheduler, evaluations=0)


def best_single_type(cost_model: CostModel) -> Plan | None:
    """The cheapest plan that runs every layer on one type (what heterogeneity is compared with)."""
    return _cheapest_single_type(cost_model, RESOURCE_KINDS, "single-type")


def best_single_type_of_kind(cost_model: CostModel, kind: str) -> Plan | None:
    """The cheapest plan that runs every layer on one type of ``kind`` (all-CPU, all-GPU)."""
    return _cheapest_single_type(cost_model, (kind,), f"all-{kind}")


def single_kind_plans(cost_model: CostModel) -> dict[str, Plan | None]:
    """Kind (cpu, gpu) -> the cheapest plan on one type of that kind: "a CPU cluster" and "a GPU cluster" are
    what a mixed one is usually weighed against, and the best single type alone hides the other kind's price.
    Only kinds the cluster has and a one-stage plan may run on (``--trainer-kinds``): for the others "none meets
    the target" would be the wrong reason."""
    allowed = cost_model.one_stage_kinds or RESOURCE_KINDS
    present = {t.kind for t in cost_model.types}
    return {
        kind: best_single_type_of_kind(cost_model, kind)
        for kind in RESOURCE_KINDS
        if kind in present and kind in allowed
    }


def single_kind_line(kind: str, alt: Plan | None, stand_ins: tuple[str, ...] = ()) -> str:
    """``all-CPU (type): N units, <price>``, or that there is none; ``stand_ins`` are the gpu types this
    machine's cores stand in for (the job's report says so)."""
    if alt is None:
        return f"all-{kind.upper()}: no single {kind} type meets it within max_units"
    name = alt.stages[0].resource
    note = ", standing in for a GPU on this machine's cores" if name in stand_ins else ""
    units = sum(s.units for s in alt.stages)
    return f"all-{kind.upper()} ({name}{note}): {units} unit{'s' * (units != 1)}, {_price(alt)}"


def _layers(stage: Stage) -> str:
    names = stage.layers[0] if len(stage.layers) == 1 else f"{stage.layers[0]} .. {stage.layers[-1]}"
    return f"{names} ({len(stage.layers)})"


def stage_table(plan: Plan, unit_word: str = "units") -> list[str]:
    rows = [f"  {'stage':>5}  {'resource':<16} {'kind':<4} {unit_word:>9}  {'layers':<34} {'samples/s':>12}"]
    for index, stage in enumerate(plan.stages, 1):
        rows.append(
            f"  {index:>5}  {stage.resource:<16} {stage.kind:<4} {stage.units:>9}  {_layers(stage):<34} "
            f"{stage.throughput:>12,.0f}"
        )
    return rows


def _price(plan: Plan) -> str:
    return (
        f"{plan.throughput:,.0f} samples/s, {plan.cost_per_hour:.4g}/h, "
        f"{plan.cost_per_million_samples:.4g} per million samples"
    )


def format_summary(cost_model: CostModel, plan: Plan) -> str:
    """``heterps plan``'s summary of one plan, with the best single-type plan beside it."""
    lines = [
        f"model {plan.model}: {cost_model.num_layers} layers, {cost_model.num_types} resource types, "
        f"target {cost_model.throughput:,.0f} samples/s, scheduler {plan.scheduler} "
        f"({plan.search_seconds:.2f} s, {plan.evaluations} evaluations)"
    ]
    if not plan.feasible:
        lines.append(f"  infeasible: {plan.reason}")
    else:
        lines.extend(stage_table(plan))
        lines.append(f"  throughput {_price(plan)}")
    single = best_single_type(cost_model)
    if single is None:
        lines.append("best single-type plan: none meets the target within max_units")
    else:
        lines.append(f"best single-type plan ({single.stages[0].resource}):")
        lines.extend(stage_table(single))
        lines.append(f"  throughput {_price(single)}")
    by_kind = single_kind_plans(cost_model)
    lines.extend(single_kind_line(kind, alt) for kind, alt in by_kind.items())
    if plan.feasible and single is not None and single.cost_per_hour > 0:
        against = "".join(
            f", {plan.cost_per_hour / alt.cost_per_hour:.3f}x all-{kind.upper()}"
            for kind, alt in by_kind.items()
            if alt is not None and alt.cost_per_hour > 0
        )
        lines.append(
            f"heterogeneous plan costs {plan.cost_per_hour / single.cost_per_hour:.3f}x the best single-type plan"
            + against
        )
    return "\n".join(lines)


@dataclass(frozen=True)
class JobReportInputs:
    """What the job's report says besides the fit itself."""

    fit: LaunchFit
    cluster: Cluster
    cluster_source: str  # the cluster file, or "local (this machine, measured)"
    advice: Plan | None  # the best plan on any launch (the configured scheduler, provisioned), if one was found
    advice_error: str | None  # why there is no advice (the planning command failed), if so
    advice_scheduler: str
    alternatives: CostModel | None  # priced at the target (or at the plan's throughput without one)
    stand_ins: tuple[str, ...]  # gpu types that this machine's cores stand in for
    inputs: tuple[str, ...]  # lines about the measured inputs (profile, calibration, servers' cost)
    digest: str
    reused_from: str | None  # a plan file made from the same inputs, when it was reused as is
    cuda: bool  # whether Paddle here has CUDA (the advised launch's --heter_devices)


def job_report(r: JobReportInputs) -> str:
    fit, plan = r.fit, r.fit.chosen.plan
    launch = fit.launch
    lines = [
        f"heterps plan for the program being trained ({sum(len(s.layers) for s in plan.stages)} layers), "
        f"cluster {r.cluster_source}",
        "",
        "WHAT RUNS",
        f"  launched: {launch.describe()}",
    ]
    if plan.num_stages == 1:
        lines.append(f"  one stage, data-parallel on the {plan.stages[0].units} launched CPU trainers:")
    else:
        lines.append(
            f"  {plan.num_stages} stages, pipelined (stage 1 on the CPU trainers, which read the data; "
            "later stages on the heterogeneous trainers):"
        )
    lines.extend(stage_table(plan, unit_word="processes"))
    lines.append(f"  predicted {_price(plan)}")
    if fit.budget is not None:
        lines.append(f"  budget {fit.budget:.4g}/h: planned for the most samples/s this launch gives within it")
    elif fit.target is None:
        lines.append("  no throughput target: planned for the most samples/s this launch gives, at the least cost")
    else:
        met = "met" if fit.chosen.meets_target else "NOT met: this launch cannot reach it (see below)"
        lines.append(f"  target {fit.target:,.0f} samples/s: {met}")
    if fit.leaves_heter_unused:
        lines.append(
            f"  the {launch.heter_units} launched heterogeneous trainer{'s' * (launch.heter_units != 1)} "
            "run nothing: one stage on the CPU trainers is "
            + (
                "cheaper and meets the target"
                if fit.target is not None and fit.chosen.meets_target
                else "as fast for less"
            )
            + "; they leave at minimize"
        )
    for option, what in ((fit.one_stage, "one stage on the CPU trainers"), (fit.split, "every launched stage used")):
        if option is not None and option is not fit.chosen:
            lines.append(
                f"  not chosen: {what}: {_price(option.plan)}"
                + ("" if fit.target is None else ", target " + ("met" if option.meets_target else "not met"))
            )
    for stand_in in r.stand_ins:
        lines.append(f"  {stand_in} stands in for a GPU on this machine's cores (no CUDA here)")
    lines.extend(f"  assumed: {note}" for note in fit.notes)

    lines += ["", "OTHER LAUNCHES"]
    lines.extend(_advice_lines(r))

    if r.alternatives is not None:
        lines += [
            "",
            f"SINGLE-TYPE ALTERNATIVES at {r.alternatives.throughput:,.0f} samples/s (a launch of this cluster)",
        ]
        alternatives = single_kind_plans(r.alternatives).items()
        lines.extend(f"  {single_kind_line(kind, alt, r.stand_ins)}" for kind, alt in alternatives)
        allowed = r.alternatives.one_stage_kinds or RESOURCE_KINDS
        for kind in sorted({t.kind for t in r.alternatives.types} - set(allowed)):
            lines.append(
                f"  all-{kind.upper()}: not a plan this machine can launch (a one-stage plan's trainers are "
                f"{'/'.join(allowed)} types here{'' if r.cuda else ': Paddle has no CUDA'})"
            )

    lines += [
        "",
        "INPUTS (the same inputs give the same plan; heterps_configs['replan'] = True measures and plans again)",
    ]
    lines.extend(f"  {line}" for line in r.inputs)
    lines.append(
        f"  inputs digest {r.digest}"
        + (f"; plan reused from {r.reused_from}, made from the same inputs" if r.reused_from else "")
    )
    return "\n".join(lines) + "\n"


def _advice_lines(r: JobReportInputs) -> list[str]:
    fit, plan = r.fit, r.fit.chosen.plan
    advice = r.advice
    if r.advice_error is not None:
        return [f"  not known: {r.advice_error}"]
    if advice is None or not advice.feasible:
        why = advice.reason if advice is not None else "no target to provision for"
        return [f"  no plan on any launch of this cluster does better ({why})"]
    args = " ".join(shape_of(advice, gpu_available=r.cuda, server_num=fit.launch.servers).arguments())
    summary = " | ".join(f"{s.resource} x{s.units}: {_layers(s)}" for s in advice.stages)
    target_missed = fit.target is not None and not fit.chosen.meets_target
    if fit.budget is not None:  # the advice is the fastest plan on any launch within the same budget
        if advice.throughput > plan.throughput * (1 + THROUGHPUT_TIE):
            return [
                f"  faster within {fit.budget:.4g}/h: {summary}, predicted {_price(advice)}",
                f"    launch with: {args}  (scheduler {r.advice_scheduler})",
            ]
        return [
            f"  none faster within {fit.budget:.4g}/h: the best plan on any launch gives {advice.throughput:,.0f} "
            f"samples/s (scheduler {r.advice_scheduler})"
        ]
    # The cheapest plan a launch can run that the report lists: the advice, or a single-type alternative (the same
    # launchable rules) that the advising scheduler did not better.  Never "none cheaper" beside a cheaper one.
    for alt in single_kind_plans(r.alternatives).values() if r.alternatives is not None else ():
        if alt is not None and alt.feasible and alt.cost_per_hour < advice.cost_per_hour * (1 - 1e-9):
            advice = alt
            args = " ".join(shape_of(alt, gpu_available=r.cuda, server_num=fit.launch.servers).arguments())
            summary = " | ".join(f"{s.resource} x{s.units}: {_layers(s)}" for s in alt.stages)
    saving = plan.cost_per_hour - advice.cost_per_hour
    if target_missed:
        return [
            f"  to meet the target: {summary}, predicted {_price(advice)}",
            f"    launch with: {args}  (scheduler {r.advice_scheduler})",
        ]
    if saving > 1e-9 * max(1.0, plan.cost_per_hour):
        share = saving / plan.cost_per_hour if plan.cost_per_hour > 0 else 0.0
        at = f"{fit.target:,.0f}" if fit.target is not None else f"{plan.throughput:,.0f} (this plan's)"
        return [
            f"  cheaper at {at} samples/s: {summary}, {advice.cost_per_hour:.4g}/h, saves {saving:.4g}/h ({share:.0%})",
            f"    launch with: {args}  (scheduler {r.advice_scheduler})",
        ]
    return [
        f"  none cheaper at this throughput: the best plan on any launch costs {advice.cost_per_hour:.4g}/h "
        f"(scheduler {r.advice_scheduler})"
    ]
