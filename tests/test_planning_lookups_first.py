"""A split's lookups run on its first stage (planning/model.lookups_end; docs/models.md).

Paddle's heterogeneous trainers hold no lookup and a split refuses a sparse layer on a GPU stage, so a model whose
dense layers come before a lookup in program order (PaddleRec's Wide&Deep: its wide linear first; DLRM: its bottom
MLP) cannot be cut there.  The planner says so and plans around it: the launch fit cuts only after the last sparse
layer, and the schedulers' cost model (with the runtime's rules) prices a later stage holding a lookup as impossible,
naming why.  The profile here is shaped so that without the rule the best split is the forbidden one."""

import math

from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.launch import HeterGroup, LaunchShape
from heterps_paddle.planning.launch_fit import fit_to_launch
from heterps_paddle.planning.model import Cluster, LayerProfile, ModelProfile, ResourceType, lookups_end
from heterps_paddle.planning.planner import launchable_cost_model, make_plans

# Wide&Deep's order: the wide linear, the lookups, the deep layers.  The lookups are slow on the cpu type and fast
# on the gpu type, so a split would put them on the gpu if it could.
LAYERS = (("wide", "dense", 1e-5, 1e-5), ("embedding_0", "sparse", 8e-3, 1e-5), ("fc_1", "dense", 2e-4, 1e-5))


def profile(layers=LAYERS):
    return ModelProfile(
        "wide_deep_like",
        256,
        tuple(
            LayerProfile(name, kind, flops=1e6, param_bytes=1e3, io_bytes=0, out_bytes=0, time={"cpu": c, "gpu": g})
            for name, kind, c, g in layers
        ),
    )


def cluster():
    common = dict(max_units=8, flops=1e12, mem_bw=1e11, memory=1e12, net_bw=1e12)
    return Cluster((ResourceType("cpu", "cpu", 1.0, **common), ResourceType("gpu", "gpu", 3.0, **common)))


def test_the_rule_is_where_the_last_sparse_layer_ends():
    assert lookups_end(profile()) == 2
    assert lookups_end(profile(tuple((n, "dense", c, g) for n, _, c, g in LAYERS))) == 0


def test_without_the_rule_the_best_split_would_put_the_lookups_on_the_gpu():
    model = CostModel(profile(), cluster(), 1.0)  # the reference reading: no runtime rules
    forbidden = model.stage_time(1, 3, 1, 1)
    allowed = model.stage_time(2, 3, 1, 1)
    first_forbidden, first_allowed = model.stage_time(0, 1, 0, 1), model.stage_time(0, 2, 0, 1)
    assert max(first_forbidden, forbidden) < max(first_allowed, allowed) / 10  # the forbidden cut is far faster


def test_the_launch_fit_cuts_only_after_the_last_lookup_and_says_so():
    fit = fit_to_launch(profile(), cluster(), LaunchShape(1, (HeterGroup(1, "gpu"),)), target=1e9)
    assert fit.split is not None
    assert [s.layers for s in fit.split.plan.stages] == [("wide", "embedding_0"), ("fc_1",)]
    assert any("first cut comes after embedding_0, the last sparse layer" in note for note in fit.notes), fit.notes


def test_a_model_ending_in_a_lookup_has_no_split():
    layers = (("fc_0", "dense", 1e-5, 1e-5), ("embedding_0", "sparse", 8e-3, 1e-5))
    fit = fit_to_launch(profile(layers), cluster(), LaunchShape(1, (HeterGroup(1, "gpu"),)), target=1e9)
    assert fit.split is None and fit.chosen.plan.num_stages == 1
    assert any("the program's last layer: no split fits it" in note for note in fit.notes), fit.notes


def test_the_cost_model_with_the_runtimes_rules_names_why_a_cut_is_impossible():
    model = launchable_cost_model(profile(), cluster(), 1.0, ("cpu",))
    forbidden = model.evaluate([0, 1, 1])  # wide on the CPU trainers, the lookups on the gpu
    assert math.isinf(forbidden.stages[1].time_per_sample)
    assert "lookups run on its first stage (the CPU trainers)" in forbidden.reason
    assert "starts at embedding_0, before the last sparse layer embedding_0" in forbidden.reason
    assert not math.isinf(model.evaluate([0, 0, 1]).stages[1].time_per_sample)


def test_every_scheduler_plans_around_it():
    # At 500 samples/s the forbidden split (1 cpu unit + 1 gpu, 4/h) is cheaper than any plan with the lookups on
    # the CPU trainers (5 cpu units or more): the reference reading takes it, the runtime's rules do not.
    reference = CostModel(profile(), cluster(), 500.0)
    assert reference.evaluate([0, 1, 1]).feasible and reference.evaluate([0, 1, 1]).cost_per_hour == 4.0
    for scheduler in ("exact", "greedy", "brute"):
        ((_, plan),) = make_plans(profile(), cluster(), scheduler, [500.0])
        assert plan.feasible and "embedding_0" in plan.stages[0].layers, (scheduler, plan)
