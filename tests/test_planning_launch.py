"""The launch as part of the cluster (planning/launch.py, planning/launch_fit.py): reading the launcher's
environment, checking saved plans against it, and the best plan that fits a launch, against a brute force."""

import itertools
import json
import math

import pytest

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.launch import (
    LAUNCH_ENV,
    HeterGroup,
    LaunchMismatchError,
    LaunchShape,
    check_launch_matches,
    launch_arguments,
    launch_from_env,
)
from heterps_paddle.planning.launch_fit import THROUGHPUT_TIE, fit_to_launch
from heterps_paddle.planning.model import (
    Cluster,
    LayerProfile,
    ModelProfile,
    PlanningInputError,
    ResourceType,
    plan_from_dict,
)

HETER_ENV = {
    "TRAINING_ROLE": "TRAINER",
    "PADDLE_TRAINERS_NUM": "2",
    "STAGE_NUM": "3",
    "PADDLE_STAGE_TRAINERS_NUM": "[2, '1', '3']",
    "PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:1,127.0.0.1:2",
}


def test_launch_from_env_reads_counts_and_only_told_devices():
    shape = launch_from_env(HETER_ENV)
    assert shape == LaunchShape(2, (HeterGroup(1, None), HeterGroup(3, None)), servers=2)
    told = {
        **HETER_ENV,
        LAUNCH_ENV: json.dumps({"worker_num": 2, "heter_worker_num": [1, 3], "heter_devices": ["gpu", "cpu"]}),
    }
    assert [g.device for g in launch_from_env(told).heter] == ["gpu", "cpu"]
    # a description that disagrees with what Paddle started is not trusted
    wrong = {
        **told,
        LAUNCH_ENV: json.dumps({"worker_num": 2, "heter_worker_num": [1, 1], "heter_devices": ["gpu", "gpu"]}),
    }
    assert [g.device for g in launch_from_env(wrong).heter] == [None, None]
    # the hosts' types, where heterps launch placed the groups on a hosts file's hosts
    typed = {
        **HETER_ENV,
        LAUNCH_ENV: json.dumps(
            {
                "worker_num": 2,
                "heter_worker_num": [1, 3],
                "heter_devices": ["cpu", "cpu"],
                "worker_type": "cpu_16",
                "heter_types": ["gpu_a100", None],
            }
        ),
    }
    shape = launch_from_env(typed)
    assert shape.cpu_type == "cpu_16" and [g.type for g in shape.heter] == ["gpu_a100", None]
    assert LaunchShape.from_dict(shape.to_dict()) == shape
    assert "cpu_16 hosts" in shape.describe() and "gpu_a100 hosts" in shape.describe()
    with pytest.raises(PlanningInputError, match="heter_types"):
        LaunchShape.from_dict({"worker_num": 2, "heter_worker_num": [1], "heter_types": ["a", "b"]})
    with pytest.raises(PlanningInputError, match="host type"):
        LaunchShape.from_dict({"worker_num": 2, "worker_type": 7})
    assert launch_from_env({"TRAINING_ROLE": "PSERVER"}) is None  # servers are not told the stages
    assert launch_from_env({}) is None
    assert launch_from_env({"TRAINING_ROLE": "TRAINER", "PADDLE_TRAINERS_NUM": "3"}) == LaunchShape(3)


STAGES3 = [
    {"resource": "cpu_16", "kind": "cpu", "layers": ["embedding_0"], "units": 2},
    {"resource": "gpu_a100", "kind": "gpu", "layers": ["fc_0"], "units": 1},
    {"resource": "cpu_64", "kind": "cpu", "layers": ["fc_1", "fc_2"], "units": 3},
]


def test_launch_arguments_follow_the_plan():
    plan = plan_from_dict({"format": 1, "feasible": True, "stages": STAGES3})
    assert launch_arguments(plan, 1, gpu_available=False) == [
        "--server_num=1",
        "--worker_num=2",
        "--heter_worker_num=1;3",
        "--heter_devices=cpu;cpu",
    ]
    assert launch_arguments(plan, 2, gpu_available=True)[-1] == "--heter_devices=gpu;cpu"


def test_saved_plan_against_the_launch_names_what_it_expects():
    plan = plan_from_dict({"format": 1, "feasible": True, "stages": STAGES3})
    check_launch_matches(plan, launch_from_env(HETER_ENV))
    with pytest.raises(LaunchMismatchError, match=r"expects 3 stages with \[2, 1, 3\].*--worker_num=2"):
        check_launch_matches(plan, LaunchShape(2, (HeterGroup(1, None), HeterGroup(1, None))))
    one = plan_from_dict({"format": 1, "feasible": True, "stages": [{**STAGES3[0], "units": 3}]})
    check_launch_matches(one, LaunchShape(4, (HeterGroup(1, "cpu"),)))  # more trainers only add throughput
    with pytest.raises(LaunchMismatchError, match="needs 3 trainers"):
        check_launch_matches(one, LaunchShape(2))


def test_plan_stage_kind_comes_from_the_plan_or_the_cluster_never_from_the_name():
    with pytest.raises(PlanningInputError, match=r"stages\[0\].kind: missing"):
        plan_from_dict({"format": 1, "feasible": True, "stages": [{"resource": "gpu_x", "layers": ["a"], "units": 1}]})
    plan = plan_from_dict(
        {"format": 1, "feasible": True, "stages": [{"resource": "gpu_x", "layers": ["a"], "units": 1}]},
        kinds={"gpu_x": "cpu"},
    )
    assert plan.stages[0].kind == "cpu"
    with pytest.raises(PlanningInputError, match="already placed"):
        plan_from_dict(
            {"format": 1, "feasible": True, "stages": [STAGES3[0], {**STAGES3[1], "layers": ["embedding_0"]}]}
        )


# ----------------------------------------------------------------------------------------------- the fit


def profile(times_cpu, times_gpu, names=None):
    names = names or [f"l{i}" for i in range(len(times_cpu))]
    return ModelProfile(
        "m",
        256,
        tuple(
            LayerProfile(
                n,
                "sparse" if i == 0 else "dense",
                flops=1e6,
                param_bytes=1e3,
                io_bytes=0,
                out_bytes=0,
                time={"cpu": c, "gpu": g},
            )
            for i, (n, c, g) in enumerate(zip(names, times_cpu, times_gpu))
        ),
    )


def cluster(cpu_price=1.0, gpu_price=3.0):
    common = dict(max_units=8, flops=1e12, mem_bw=1e11, memory=1e12, net_bw=1e12)
    return Cluster((ResourceType("cpu", "cpu", cpu_price, **common), ResourceType("gpu", "gpu", gpu_price, **common)))


def brute_force(prof, clus, launch, target):
    """Every fitting plan, priced independently of launch_fit (one stage, or every launched stage)."""
    cm = CostModel(prof, clus, target or 1.0)
    n = len(prof.layers)
    options = []
    for t in range(len(clus.resource_types)):
        if clus.resource_types[t].kind == "cpu":
            time = cm.stage_time(0, n, t, launch.cpu_trainers)
            options.append((launch.cpu_trainers / time, launch.cpu_trainers * clus.resource_types[t].price_per_hour, 1))
    units = launch.stage_units()
    for types in itertools.product(range(len(clus.resource_types)), repeat=launch.num_stages):
        if clus.resource_types[types[0]].kind != "cpu":
            continue
        for cuts in itertools.combinations(range(1, n), launch.num_stages - 1):
            bounds = [0, *cuts, n]
            rate = min(u / cm.stage_time(bounds[s], bounds[s + 1], types[s], u) for s, u in enumerate(units))
            options.append(
                (rate, sum(u * clus.resource_types[t].price_per_hour for u, t in zip(units, types)), launch.num_stages)
            )
    return options


@pytest.mark.parametrize("target", [None, 1000.0, 5000.0, 1e9])
def test_fit_matches_a_brute_force_of_the_objective(target):
    prof = profile([1e-4, 8e-4, 8e-4, 2e-4], [5e-5, 1e-4, 1e-4, 3e-5])
    launch = LaunchShape(2, (HeterGroup(1, "gpu"),))
    fit = fit_to_launch(prof, cluster(), launch, target)
    options = brute_force(prof, cluster(), launch, target)
    chosen = fit.chosen.plan
    meeting = [o for o in options if target is not None and o[0] >= target]
    if meeting:
        assert math.isclose(chosen.cost_per_hour, min(c for _, c, _ in meeting))
        assert chosen.throughput >= target
    else:
        best = max(r for r, _, _ in options)
        assert chosen.throughput >= best * (1 - THROUGHPUT_TIE)
        near = [c for r, c, _ in options if r >= best * (1 - THROUGHPUT_TIE)]
        assert math.isclose(chosen.cost_per_hour, min(near))
    assert [s.units for s in chosen.stages] in ([2], [2, 1])


@pytest.mark.parametrize("budget", [2.0, 4.5, 5.0, 100.0])
def test_a_budget_gets_the_fastest_fitting_plan_within_it(budget):
    prof = profile([1e-4, 8e-4, 8e-4, 2e-4], [5e-5, 1e-4, 1e-4, 3e-5])
    launch = LaunchShape(2, (HeterGroup(1, None),))  # a group of unknown device: any type, as the brute force
    fit = fit_to_launch(prof, cluster(), launch, budget=budget)
    within = [o for o in brute_force(prof, cluster(), launch, None) if o[1] <= budget]
    best = max(r for r, _, _ in within)
    chosen = fit.chosen.plan
    assert chosen.cost_per_hour <= budget and chosen.throughput >= best * (1 - THROUGHPUT_TIE)
    assert fit.budget == budget and any("budget" in note for note in fit.notes)


def test_a_budget_below_every_fitting_plan_names_the_cheapest():
    prof = profile([1e-4, 8e-4], [5e-5, 1e-4])
    with pytest.raises(
        PlanningInputError, match=r"fits the budget of 1/h: the cheapest, 2 x cpu \(l0, l1\), costs 2/h"
    ):
        fit_to_launch(prof, cluster(), LaunchShape(2, (HeterGroup(1, "gpu"),)), budget=1.0)
    with pytest.raises(PlanningInputError, match="not both"):
        fit_to_launch(prof, cluster(), LaunchShape(2), target=10.0, budget=5.0)


def test_a_cheap_enough_target_leaves_the_heterogeneous_trainers_unused():
    prof = profile([1e-4, 8e-4], [5e-5, 1e-4])
    fit = fit_to_launch(prof, cluster(), LaunchShape(2, (HeterGroup(1, "gpu"),)), target=500.0)
    assert fit.chosen.plan.num_stages == 1 and fit.leaves_heter_unused
    assert fit.split is not None and fit.split.meets_target  # it would meet it too, at a higher cost


def test_a_target_only_the_split_meets_is_met_by_the_split():
    prof = profile([1e-5, 8e-3, 8e-3], [5e-5, 1e-5, 1e-5])
    fit = fit_to_launch(prof, cluster(), LaunchShape(1, (HeterGroup(1, "gpu"),)), target=10_000.0)
    plan = fit.chosen.plan
    assert plan.num_stages == 2 and fit.chosen.meets_target
    assert [s.layers for s in plan.stages] == [("l0",), ("l1", "l2")]
    assert [(s.resource, s.kind, s.units) for s in plan.stages] == [("cpu", "cpu", 1), ("gpu", "gpu", 1)]


def test_device_of_a_heterogeneous_group_limits_its_types():
    prof = profile([1e-5, 8e-3], [5e-5, 1e-5])
    on_cpu = fit_to_launch(prof, cluster(), LaunchShape(1, (HeterGroup(1, "cpu"),)), target=10_000.0)
    assert on_cpu.split.plan.stages[1].resource == "cpu"  # a cpu group cannot be the gpu type...
    stand_in = fit_to_launch(
        prof, cluster(), LaunchShape(1, (HeterGroup(1, "cpu"),)), target=10_000.0, stand_in_gpu=True
    )
    assert stand_in.chosen.plan.stages[1].resource == "gpu"  # ...unless this machine's cores stand in for it


def test_each_group_is_timed_and_priced_as_the_type_of_the_hosts_it_runs_on():
    """A heterogeneous trainer on a host the hosts file calls gpu (its cores standing in here) is that type, even
    where a cheaper cpu type would predict as fast: the plan then prices and times the machine it has."""
    prof = profile([1e-4, 1e-5], [1e-4, 1e-6])  # stage 1 bounds any split: stage 2 on either type is as fast
    untyped = fit_to_launch(prof, cluster(), LaunchShape(2, (HeterGroup(1, "cpu"),)), 1e9, stand_in_gpu=True)
    assert untyped.split.plan.stages[1].resource == "cpu"  # the tie goes to the cheaper type: not the host's
    launch = LaunchShape(2, (HeterGroup(1, "cpu", "gpu"),), cpu_type="cpu")
    typed = fit_to_launch(prof, cluster(), launch, 1e9, stand_in_gpu=True)
    assert [s.resource for s in typed.split.plan.stages] == ["cpu", "gpu"]
    assert typed.split.plan.cost_per_hour == 2 * 1.0 + 3.0
    # a type the cluster file does not have for the group leaves its candidates as they were, said so
    unknown = fit_to_launch(prof, cluster(), LaunchShape(2, (HeterGroup(1, "cpu", "tpu"),)), 1e9, stand_in_gpu=True)
    assert unknown.split.plan.stages[1].resource == "cpu"
    assert any("stage 2: the hosts file names their hosts' type tpu" in note for note in unknown.notes)


def test_shared_cores_bound_the_plan():
    prof = profile([1e-4, 1e-4], [1e-4, 1e-4])
    free = fit_to_launch(prof, cluster(gpu_price=1.0), LaunchShape(2, (HeterGroup(2, "cpu"),)), None)
    shared = fit_to_launch(prof, cluster(gpu_price=1.0), LaunchShape(2, (HeterGroup(2, "cpu"),)), None, host_cores=2)
    assert free.chosen.plan.num_stages == 2  # 4 units, each its own machine: twice the samples/s
    # on 2 shared cores a sample costs 2e-4 CPU seconds either way: the split gains nothing, so one stage wins
    assert shared.chosen.plan.num_stages == 1 and math.isclose(shared.chosen.plan.throughput, 2 / 2e-4, rel_tol=1e-3)


def test_the_fit_is_deterministic_and_prefers_fewer_stages_on_ties():
    prof = profile([1e-4, 1e-4, 1e-4], [1e-4, 1e-4, 1e-4])
    launch = LaunchShape(1, (HeterGroup(1, None),))
    fits = [fit_to_launch(prof, cluster(1.0, 1.0), launch, None) for _ in range(3)]
    assert len({json.dumps(f.chosen.plan.to_dict(), sort_keys=True) for f in fits}) == 1
    assert fits[0].chosen.plan.num_stages == 2  # 2 units beat 1 by far more than the tie margin
    equal = fit_to_launch(profile([1e-4], [1e-4]), cluster(1.0, 1.0), launch, None)
    assert equal.chosen.plan.num_stages == 1  # one layer: no split fits


def test_launch_files_dir_is_per_launch():
    from heterps_paddle.rendezvous import LAUNCH_ID_ENV, launch_files_dir

    one = {"PADDLE_PSERVERS_IP_PORT_LIST": "127.0.0.1:6000", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6001"}
    other = {**one, "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6002"}  # another launch: other random ports
    assert launch_files_dir("/c", one) == launch_files_dir("/c", dict(one))
    assert launch_files_dir("/c", one) != launch_files_dir("/c", other)
    assert launch_files_dir("/c", one).startswith("/c/launches/")
    assert launch_files_dir("/c", {}) is None  # not started by a launcher
    # A coordinated launch (heterps launch --hosts) names itself: a hosts file fixes every port, so two launches of
    # the same file share their endpoints.
    assert launch_files_dir("/c", {**one, LAUNCH_ID_ENV: "a1"}) != launch_files_dir("/c", {**one, LAUNCH_ID_ENV: "b2"})


def test_the_launchs_plan_cut_is_run_as_it_is_not_chosen_again():
    """A round of a launch across hosts runs its plan file's cut (an adaptive move's, as the launch's machine
    decided it): the fit inside minimize keeps it, whatever the uncorrected model would choose."""
    prof = profile([1e-5, 8e-3, 8e-3], [5e-5, 1e-5, 1e-5])
    free = fit_to_launch(prof, cluster(), LaunchShape(1, (HeterGroup(1, "gpu"),)), target=10_000.0)
    assert [s.layers for s in free.chosen.plan.stages] == [("l0",), ("l1", "l2")]
    told = LaunchShape(1, (HeterGroup(1, "gpu"),), layers=(("l0", "l1"), ("l2",)))
    fit = fit_to_launch(prof, cluster(), told, target=10_000.0)
    assert [s.layers for s in fit.chosen.plan.stages] == [("l0", "l1"), ("l2",)]
    assert any("the cut of the plan the launch was started for" in n for n in fit.notes)
    # a plan of one stage on a launch that has heterogeneous trainers: one stage (they leave unused)
    told_one = LaunchShape(1, (HeterGroup(1, "gpu"),), layers=(("l0", "l1", "l2"),))
    one = fit_to_launch(prof, cluster(), told_one, target=10_000.0)
    assert one.chosen.plan.num_stages == 1 and one.leaves_heter_unused
    # a cut of another program's layers is said, and the cut is chosen here
    other = fit_to_launch(prof, cluster(), LaunchShape(1, (HeterGroup(1, "gpu"),), layers=(("x",), ("y",))), 1e4)
    assert [s.layers for s in other.chosen.plan.stages] == [("l0",), ("l1", "l2")]
    assert any("not this program's" in n for n in other.notes)


def test_the_launch_description_carries_the_cut_and_refuses_a_bad_one():
    shape = LaunchShape(1, (HeterGroup(1, "gpu", "g"),), 1, "c", (("l0",), ("l1", "l2")))
    assert LaunchShape.from_dict(json.loads(json.dumps(shape.to_dict()))) == shape
    with pytest.raises(PlanningInputError, match="stage_layers"):
        LaunchShape.from_dict({**shape.to_dict(), "stage_layers": [["l0"], []]})
