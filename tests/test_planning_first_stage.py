"""The runtime's constraint that the first stage of a split plan runs on CPU trainers (they read the data), expressed
in the one cost model; a one-stage plan may run on any type."""

import dataclasses

import pytest

from heterps_paddle.planning.catalog import random_case
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Cluster
from heterps_paddle.planning.schedulers import make_scheduler


def with_gpu_types(cluster):
    # half the types become GPUs, so the constraint removes real options
    types = tuple(
        dataclasses.replace(t, kind="gpu" if i % 2 == 0 else "cpu") for i, t in enumerate(cluster.resource_types)
    )
    return Cluster(types, cluster.throughput)


def test_gpu_first_stage_is_infeasible_with_a_reason():
    profile, cluster = random_case(3, n=4, T=2)
    cluster = with_gpu_types(cluster)
    cm = CostModel(profile, cluster, first_stage_kinds=("cpu",))
    evaluation = cm.evaluate([0, 1, 1, 1])  # type 0 is a GPU
    assert not evaluation.feasible
    assert "the first stage of a split plan must run on a cpu type" in evaluation.reason
    assert cm.evaluate([0, 0, 0, 0]).reason is None or "first stage" not in cm.evaluate([0, 0, 0, 0]).reason


@pytest.mark.parametrize("scheduler", ["exact", "rl", "greedy", "genetic"])
def test_schedulers_respect_the_constraint_and_exact_matches_brute(scheduler):
    checked = 0
    for seed in range(40 if scheduler in ("exact", "greedy") else 4):
        profile, cluster = random_case(seed)
        cluster = with_gpu_types(cluster)
        constrained = CostModel(profile, cluster, first_stage_kinds=("cpu",))
        plan = make_scheduler(scheduler, seed=0).plan(constrained)
        brute = make_scheduler("brute").plan(CostModel(profile, cluster, first_stage_kinds=("cpu",)))
        if plan.feasible:
            first = plan.stages[0]
            assert plan.num_stages == 1 or first.kind == "cpu", seed
            assert plan.cost_per_hour >= brute.cost_per_hour - 1e-9
            checked += 1
        if scheduler == "exact":
            assert plan.feasible == brute.feasible, seed
            if brute.feasible:
                assert plan.cost_per_hour == pytest.approx(brute.cost_per_hour, rel=1e-9), seed
    assert checked > 0
