"""A plan's throughput and costs, computed in one place (planning/cost_model.py) for the plans the cost model
provisions and for those fitted to a launch (planning/launch_fit.py). The two price a million samples at different
rates, on purpose: a provisioned plan at the required throughput its units were bought for, a launch's plan at the
throughput it achieves (the launch fixed its units, and there may be no target)."""

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


def test_a_provisioned_plan_is_priced_at_the_required_throughput():
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
    assert plan.cost_per_million_samples == pytest.approx(plan.cost_per_hour / (3600 * 1000.0) * 1e6)


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
