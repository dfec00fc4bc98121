"""Links between hosts in the cost model (cluster file `links:`): a stage boundary's activations cross at
min(net_bw, link) of each side's type; without `links` every figure and plan is what it was."""

import dataclasses
import glob
import os

import numpy as np
import pytest
from conftest import REPO

from heterps_paddle.planning.catalog import random_case
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import (
    Cluster,
    LayerProfile,
    Links,
    ModelProfile,
    PlanningInputError,
    ResourceType,
    cluster_from_dict,
    cluster_to_dict,
    load_cluster,
    load_model_profile,
)
from heterps_paddle.planning.planner import make_plans
from heterps_paddle.planning.schedulers import make_scheduler

CPU = ResourceType("cpu", "cpu", 1.0, 8, 1e12, 1e11, 1e11, 1e9)
GPU = ResourceType("gpu", "gpu", 2.0, 8, 1e13, 1e12, 1e10, 2e9)
PROFILE = ModelProfile(
    "two",
    100,
    (
        LayerProfile("emb", "sparse", 0.0, 1e6, 0.0, 1000.0, {"cpu": 1e-5, "gpu": 4e-5}),
        LayerProfile("fc", "dense", 1e6, 4e4, 0.0, 0.0, {"cpu": 1e-4, "gpu": 1e-6}),
    ),
)


def test_boundary_activations_cross_the_link_hand_computed():
    plain = CostModel(PROFILE, Cluster((CPU, GPU), 1000.0))
    # stage 1 on cpu [emb], stage 2 on gpu [fc]: 1000 bytes leave emb
    assert plain.stage_time(0, 1, 0, 1) == pytest.approx(1e-5 + 1000 / 1e9)
    assert plain.stage_time(1, 2, 1, 1) == pytest.approx(1e-6 + 1000 / 2e9)
    links = Links(default=4e8, types={"gpu": 2.5e8})
    linked = CostModel(PROFILE, Cluster((CPU, GPU), 1000.0, links))
    assert linked.stage_time(0, 1, 0, 1) == pytest.approx(1e-5 + 1000 / 4e8)  # cpu: the default link, < 1e9
    assert linked.stage_time(1, 2, 1, 1) == pytest.approx(1e-6 + 1000 / 2.5e8)  # gpu: its own link, < 2e9
    # a link faster than the unit's own net_bw changes nothing; the dense layers' sync keeps net_bw
    fast = CostModel(PROFILE, Cluster((CPU, GPU), 1000.0, Links(default=1e12)))
    assert fast.stage_time(1, 2, 1, 2) == pytest.approx(plain.stage_time(1, 2, 1, 2))
    assert linked.stage_time(1, 2, 1, 2) == pytest.approx(1e-6 + 1000 / 2.5e8 + 2 * 4e4 / (100 * 2e9))
    # a one-stage plan has no boundary: no link term
    assert linked.stage_time(0, 2, 0, 1) == pytest.approx(plain.stage_time(0, 2, 0, 1)) == pytest.approx(1.1e-4)


def test_a_slow_link_moves_the_cut():
    """At 30,000 samples/s the split (emb on 1 cpu, fc on 1 gpu: 3.0/h) beats all-CPU (1.1e-4 s per sample: 4
    units, 4.0/h); behind a 1e7 B/s link each GPU unit spends 1e-4 s per sample on the boundary, the GPU stage
    needs 4 units (8.0/h) and the whole model stays on CPUs."""
    split = make_scheduler("exact").plan(CostModel(PROFILE, Cluster((CPU, GPU), 30000.0)))
    assert [s.resource for s in split.stages] == ["cpu", "gpu"] and split.cost_per_hour == pytest.approx(3.0)
    slow = make_scheduler("exact").plan(CostModel(PROFILE, Cluster((CPU, GPU), 30000.0, Links(types={"gpu": 1e7}))))
    assert [s.resource for s in slow.stages] == ["cpu"] and slow.cost_per_hour == pytest.approx(4.0)


def test_exact_matches_brute_force_with_links():
    rng = np.random.default_rng(7)
    checked = 0
    for seed in range(60):
        profile, cluster = random_case(seed)
        names = cluster.type_names()
        links = Links(
            default=float(rng.choice([1e6, 1e8])),
            types={name: float(rng.choice([1e5, 1e7, 1e10])) for name in names if rng.random() < 0.5},
        )
        cluster = dataclasses.replace(cluster, links=links)
        exact = make_scheduler("exact").plan(CostModel(profile, cluster))
        brute = make_scheduler("brute").plan(CostModel(profile, cluster))
        assert exact.feasible == brute.feasible, seed
        if brute.feasible:
            checked += 1
            assert exact.cost_per_hour == pytest.approx(brute.cost_per_hour, rel=1e-9), seed
    assert checked > 10


def test_the_shipped_cluster_files_plan_as_before_without_links():
    profile = load_model_profile(os.path.join(REPO, "examples", "profiles", "dlrm_criteo_1tb.yaml"))
    for path in sorted(glob.glob(os.path.join(REPO, "examples", "clusters", "*.yaml"))):
        if path.endswith("_hosts.yaml"):
            continue
        cluster = load_cluster(path)
        assert cluster.links is None, path
        infinite = dataclasses.replace(cluster, links=Links())  # a links section that limits nothing
        throughput = cluster.throughput or 1e5
        (model, plan), (model_inf, plan_inf) = (
            make_plans(profile, c, "exact", [throughput])[0] for c in (cluster, infinite)
        )
        assert np.array_equal(model.boundary_bw, model.net_bw)
        assert plan.to_dict() | {"search_seconds": 0} == plan_inf.to_dict() | {"search_seconds": 0}, path


def test_the_dlrm_what_if_plan_is_unchanged():
    profile = load_model_profile(os.path.join(REPO, "examples", "profiles", "dlrm_criteo_1tb.yaml"))
    cluster = load_cluster(os.path.join(REPO, "examples", "clusters", "dlrm_aws.yaml"))
    _, plan = make_plans(profile, cluster, "exact", [None])[0]
    assert [(s.resource, s.units) for s in plan.stages] == [("cpu_r6i_8xl", 3), ("gpu_t4", 1)]
    assert plan.cost_per_hour == pytest.approx(6.574)


def test_links_in_the_cluster_file_are_read_strictly_and_written_back():
    doc = cluster_to_dict(Cluster((CPU, GPU), 1000.0))
    assert "links" not in doc
    doc["links"] = {"default": "1.25e9", "types": {"gpu": 6.25e8}}
    cluster = cluster_from_dict(doc, "c.yaml")
    assert cluster.links == Links(1.25e9, {"gpu": 6.25e8})
    assert cluster_from_dict(cluster_to_dict(cluster)) == cluster
    with pytest.raises(PlanningInputError, match=r"c.yaml: links.types.tpu: not a resource type of this cluster"):
        cluster_from_dict({**doc, "links": {"types": {"tpu": 1e9}}}, "c.yaml")
    with pytest.raises(PlanningInputError, match=r"c.yaml: links.default: must be positive"):
        cluster_from_dict({**doc, "links": {"default": 0}}, "c.yaml")
    with pytest.raises(PlanningInputError, match=r"c.yaml: links.between: unknown key"):
        cluster_from_dict({**doc, "links": {"between": 1}}, "c.yaml")
    assert cluster.with_throughput(5.0).links == cluster.links
