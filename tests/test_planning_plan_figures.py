"""A plan's throughput and costs, computed in one place (planning/cost_model.py) for the plans the cost model
provisions and for those fitted to a launch (planning/launch_fit.py), and the job's report that shows them. One
definition of cost per million samples for both (docs/metrics.md): the plan's cost per hour over the samples it
trains per hour, never over a target it exceeds; and the report never calls a plan cheapest beside a cheaper one a
launch can run, nor lists one this machine cannot launch as if it could."""

import pytest

from heterps_paddle.planning.cost_model import (
    CostModel,
    cost_per_million_samples,
    plan_cost_per_hour,
    plan_throughput,
)
from heterps_paddle.planning.launch import HeterGroup, LaunchShape
from heterps_paddle.planning.launch_fit import fit_to_launch
from heterps_paddle.planning.model import Cluster, LayerProfile, ModelProfile, ResourceType

COMMON = dict(max_units=8, flops=1e12, mem_bw=1e11, memory=1e12, net_bw=1e12)
CLUSTER = Cluster((ResourceType("cpu", "cpu", 1.5, **COMMON), ResourceType("gpu", "gpu", 4.0, **COMMON)))
# Measured seconds per sample: the first layer is cheaper on the cpu, the other two on the gpu.
PROFILE = ModelProfile(
    "m",
    256,
    tuple(
        LayerProfile(name, "dense", flops=1e6, param_bytes=1e3, time={"cpu": cpu, "gpu": gpu})
        for name, cpu, gpu in (("a", 1e-4, 4e-4), ("b", 8e-4, 1e-4), ("c", 6e-4, 1e-4))
    ),
)


def test_a_provisioned_plan_is_priced_at_the_throughput_it_trains():
    model = CostModel(PROFILE, CLUSTER, throughput=1000.0)
    plan = model.to_plan([0, 1, 1], "exact")
    evaluation = model.evaluate([0, 1, 1])
    assert plan.throughput == plan_throughput(evaluation.stages) == min(s.throughput for s in plan.stages)
    assert plan.throughput > 1000.0  # whole units reach beyond the target
    assert (
        plan.cost_per_hour
        == plan_cost_per_hour(evaluation.stages)
        == sum(s.units * (1.5 if s.resource == "cpu" else 4.0) for s in plan.stages)
    )
    # one definition: its cost per hour over the samples it trains per hour (not the target's)
    assert plan.cost_per_million_samples == pytest.approx(plan.cost_per_hour / (3600 * plan.throughput) * 1e6)


@pytest.mark.parametrize("host_cores", [None, 1])
def test_a_launch_plan_is_priced_at_the_throughput_it_achieves(host_cores):
    launch = LaunchShape(2, (HeterGroup(1, "gpu"),))
    fit = fit_to_launch(PROFILE, CLUSTER, launch, host_cores=host_cores)
    assert fit.split is not None
    plan = fit.split.plan
    slowest = min(s.units / s.time_per_sample for s in plan.stages)
    if host_cores is None:
        assert plan.throughput == slowest
    else:  # every process on one machine: a sample costs the sum of its stages' times in CPU
        assert plan.throughput == min(slowest, host_cores / sum(s.time_per_sample for s in plan.stages))
        assert plan.throughput < slowest
    assert plan.cost_per_hour == sum(s.units * (1.5 if s.resource == "cpu" else 4.0) for s in plan.stages)
    assert plan.cost_per_million_samples == cost_per_million_samples(plan.cost_per_hour, plan.throughput)
    assert plan.cost_per_million_samples == pytest.approx(plan.cost_per_hour / (3600 * plan.throughput) * 1e6)


def test_no_throughput_prices_a_million_samples_at_infinity():
    assert cost_per_million_samples(2.0, 0.0) == float("inf")


def test_the_report_prices_every_plan_alike_and_lists_only_what_a_launch_here_can_run():
    """Issue 40's report: the chosen plan at 2/h was priced per million at its rate, the alternatives at the
    target; it said no launch was cheaper while it listed an all-GPU plan at 1/h that no launch of the (CUDA-less)
    machine could run.  Here: the cpu type costs 2/h, the gpu type 1/h and is faster; no CUDA."""
    from heterps_paddle.planning.planner import launchable_cost_model
    from heterps_paddle.planning.report import JobReportInputs, job_report
    from heterps_paddle.planning.schedulers.exact import ExactScheduler

    cluster = Cluster((ResourceType("cpu", "cpu", 2.0, **COMMON), ResourceType("gpu", "gpu", 1.0, **COMMON)))
    target = 1000.0
    fit = fit_to_launch(PROFILE, cluster, LaunchShape(2), target)
    launchable = launchable_cost_model(PROFILE, cluster, target, ("cpu",))
    advice = ExactScheduler().plan(launchable)
    report = job_report(
        JobReportInputs(fit, cluster, "c.yaml", advice, None, "exact", launchable, (), (), "d", None, False)
    )
    for plan in (fit.chosen.plan, advice):
        assert plan.cost_per_million_samples == pytest.approx(
            cost_per_million_samples(plan.cost_per_hour, plan.throughput)
        )
    alternatives = report[report.index("SINGLE-TYPE ALTERNATIVES") : report.index("INPUTS")]
    assert "all-CPU (cpu)" in alternatives
    assert "all-GPU: not a plan this machine can launch" in alternatives and "all-GPU (gpu)" not in alternatives
    # priced as the plan trains: each "X per million samples" is its cost per hour over its samples per hour
    import re

    for rate, per_hour, per_million in re.findall(
        r"([0-9,]+) samples/s, ([0-9.]+)/h, ([0-9.e+-]+) per million", report
    ):
        assert float(per_million) == pytest.approx(
            float(per_hour) / (3600 * float(rate.replace(",", ""))) * 1e6, rel=1e-3
        )
    # the same alternatives a GPU machine may launch: listed, and the advice cheaper than the chosen plan says so
    with_gpu = launchable_cost_model(PROFILE, cluster, target, ("cpu", "gpu"))
    gpu_advice = ExactScheduler().plan(with_gpu)
    report = job_report(
        JobReportInputs(fit, cluster, "c.yaml", gpu_advice, None, "exact", with_gpu, (), (), "d", None, True)
    )
    assert "all-GPU (gpu)" in report
    if gpu_advice.cost_per_hour < fit.chosen.plan.cost_per_hour:
        assert "none cheaper" not in report and "cheaper at" in report
