"""The refit (planning/refit.py): measured rates correct the cost model for the layers and types the job runs, and
the scheduler plans again on the corrected model.  Judged against the exact optimum of the same corrected model."""

from dataclasses import replace

import pytest

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Cluster, LayerProfile, ModelProfile, ResourceType
from heterps_paddle.planning.refit import Refit, combine, corrected_profile, from_rates
from heterps_paddle.planning.schedulers.exact import ExactScheduler

COMMON = dict(mem_bw=1e10, net_bw=1e9)
# at 3,500 samples/s: one stage needs 4 cpu_small (4/h); the file says gpu_fast runs the fc layers 10x faster, so
# the split (1 cpu_small for the embedding, 1 gpu_fast: 3/h) is the plan
CLUSTER = Cluster(
    (
        ResourceType("cpu_small", "cpu", 1.0, 4, flops=1e9, memory=1e10, **COMMON),
        ResourceType("gpu_fast", "gpu", 2.0, 1, flops=1e10, memory=1e8, **COMMON),
    ),
    throughput=3500.0,
)
PROFILE = ModelProfile(
    "ctr",
    512,
    (
        LayerProfile("embedding_0", "sparse", flops=0.0, param_bytes=5e8, io_bytes=832.0, out_bytes=100.0),
        LayerProfile("fc_0", "dense", flops=5e5, param_bytes=1e5, out_bytes=25.0),
        LayerProfile("fc_1", "dense", flops=4.9e5, param_bytes=1e5, out_bytes=25.0),
        LayerProfile("fc_2", "dense", flops=1e3, param_bytes=1e3, out_bytes=8.0),
    ),
)


def window(measured, works):
    return {"samples_per_s": measured, "stages": [{"stage": i, "work_share": w} for i, w in enumerate(works, 1)]}


def split_plan():
    plan = ExactScheduler().plan(CostModel(PROFILE, CLUSTER))
    assert [s.resource for s in plan.stages] == ["cpu_small", "gpu_fast"], plan  # what the file's figures say
    return plan


def test_an_overstated_type_is_found_and_the_corrected_optimum_leaves_it():
    plan = split_plan()
    # measured: the gpu stage works all the time at a tenth of its prediction; the cpu stage waits for it
    measured = plan.stages[1].throughput / 10
    refit = from_rates(plan, window(measured, [0.05, 1.0]), PROFILE, CLUSTER)
    assert refit.unexplained == 1.0
    assert refit.factors(PROFILE, CLUSTER)["gpu_fast"] > 9
    assert {layer for layer, _ in refit.times} == {"embedding_0", "fc_0", "fc_1", "fc_2"}
    corrected = CostModel(corrected_profile(PROFILE, refit), CLUSTER)
    # the corrected model explains the window: the running plan's gpu stage, on its one unit, trains what was measured
    assert 1 / corrected.stage_time(1, 4, 1, 1) == pytest.approx(measured, rel=0.05)
    best = ExactScheduler().plan(corrected)
    assert [s.resource for s in best.stages] == ["cpu_small"]  # one stage on the CPUs: the split does not pay
    # fc on cpu_small was never run: its time is the model's (a bet the next windows check)
    assert ("fc_0", "cpu_small") not in refit.times


def test_what_no_work_share_explains_is_the_pipelines_on_a_split_and_the_machines_on_one_stage():
    """On a split the measured rate under every stage's capacity is the pipeline's (a round trip no stage's work
    covers): a pipeline is predicted that much slower, one stage is not.  On one stage it is the machine's (a
    throttled host: its processes off the CPU without waiting for anyone): its unit time is raised."""
    from heterps_paddle.planning.refit import predicted

    plan = split_plan()
    measured = plan.throughput / 2
    refit = from_rates(plan, window(measured, [0.01, 0.3]), PROFILE, CLUSTER)
    assert refit.pipeline > 1.0 and refit.unexplained == 1.0
    corrected = CostModel(corrected_profile(PROFILE, refit), CLUSTER)
    rate = min(
        plan.stages[0].units / corrected.stage_time(0, 1, 0, plan.stages[0].units), 1 / corrected.stage_time(1, 4, 1, 1)
    )
    assert predicted(replace(plan, throughput=rate), refit) == pytest.approx(measured, rel=0.05)
    one = ExactScheduler().plan(CostModel(PROFILE, CLUSTER, throughput=1000.0))
    assert one.num_stages == 1
    refit = from_rates(one, window(one.throughput / 3, [0.3]), PROFILE, CLUSTER)
    # capacity (rate / work) over the rate: the share of the time the stage was neither working nor waiting
    assert refit.unexplained == pytest.approx(1 / 0.3, rel=0.01) and refit.pipeline == 1.0


def test_windows_combine_to_their_median_and_say_their_spread():
    plan = split_plan()
    base = plan.stages[1].throughput
    refits = [from_rates(plan, window(base / f, [0.05, 1.0]), PROFILE, CLUSTER) for f in (9.0, 10.0, 12.0)]
    combined = combine(refits)
    middle = refits[1].times[("fc_0", "gpu_fast")]
    assert combined.times[("fc_0", "gpu_fast")] == pytest.approx(middle)
    assert combined.spread["gpu_fast"] > 0.2
    assert from_rates(plan, window(0.0, [0.5, 0.5]), PROFILE, CLUSTER) is None  # nothing trained: nothing said


def test_without_a_target_the_proposal_is_the_cheapest_per_sample_at_no_lower_rate():
    """The cost per sample objective (launch/rounds.py: best_on_measurements with neither target nor budget): of the
    plans the corrected model gives for the hosts, the one that trains a sample for least among those at least as
    fast as the running plan; the exact optimum of the same model at that rate is one of them."""
    from heterps_paddle.launch.rounds import best_on_measurements, per_sample
    from heterps_paddle.planning.hosts import Host, HostsFile
    from heterps_paddle.planning.replan import PlanningInputs

    cluster = replace(CLUSTER, throughput=None)
    hosts = HostsFile(tuple(Host(f"10.0.0.{i}", "cpu_small") for i in (1, 2, 3, 4)) + (Host("10.0.0.5", "gpu_fast"),))
    inputs = PlanningInputs(PROFILE, cluster, None, None, "exact", 0)
    running = 3500.0
    best = best_on_measurements(inputs, hosts, frozenset(), None, running)
    assert best.throughput >= running * (1 - 1e-3)
    optimum = ExactScheduler().plan(CostModel(PROFILE, cluster, running))
    assert per_sample(best) <= per_sample(optimum) * (1 + 1e-9)
    # nothing faster than the running plan is cheaper a sample on the same model (the fastest the hosts reach either)
    fastest = best_on_measurements(replace(inputs, target=1e12), hosts, frozenset(), None, running)
    assert per_sample(best) <= per_sample(fastest) * (1 + 1e-9)


def test_a_plan_onto_a_type_the_job_never_measured_names_it_priced_from_the_file():
    """launch/rounds.py: never_measured: the types of a proposed plan with a layer neither the published profile
    (the launch's own timing, a host's type timed before the plan) nor the windows' correction measured there."""
    from heterps_paddle.launch.rounds import never_measured

    plan = split_plan()
    assert sorted({s.resource for s in plan.stages}) == ["cpu_small", "gpu_fast"]
    assert never_measured(plan, PROFILE, None) == ("cpu_small", "gpu_fast")  # the file's figures alone
    timed = replace(
        PROFILE, layers=tuple(replace(layer, time={"cpu_small": 1e-5}) for layer in PROFILE.layers)
    )  # every layer timed on the launch's CPU type
    assert never_measured(plan, timed, None) == ("gpu_fast",)
    gpu_layers = [layer for s in plan.stages if s.resource == "gpu_fast" for layer in s.layers]
    ran = Refit({(layer, "gpu_fast"): 1e-6 for layer in gpu_layers})  # windows that ran those layers there
    assert never_measured(plan, timed, ran) == ()
