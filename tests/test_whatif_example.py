"""The shipped what-if (examples/profiles/dlrm_criteo_1tb.yaml on examples/clusters/dlrm_aws.yaml): heterogeneity
pays at production scale, and the figures the README quotes are the ones `heterps plan` prints today."""

import os
import re

import pytest
from conftest import REPO, run_cli

from heterps_paddle.planning.model import Plan, load_cluster, load_model_profile
from heterps_paddle.planning.planner import launchable_cost_model, make_plans
from heterps_paddle.planning.report import best_single_type, single_kind_plans

PROFILE = os.path.join(REPO, "examples", "profiles", "dlrm_criteo_1tb.yaml")
CLUSTER = os.path.join(REPO, "examples", "clusters", "dlrm_aws.yaml")
COMMAND = (
    "heterps plan --model examples/profiles/dlrm_criteo_1tb.yaml --cluster examples/clusters/dlrm_aws.yaml "
    "--scheduler exact"
)


@pytest.fixture(scope="module")
def what_if() -> dict[str, Plan]:
    """The exact plan at the cluster file's target and what it is weighed against."""
    profile, cluster = load_model_profile(PROFILE), load_cluster(CLUSTER)
    cost_model, plan = make_plans(profile, cluster, "exact", [None])[0]
    # The same cost model the CLI prices the alternatives with (the runtime's rules included).
    reference = launchable_cost_model(profile, cluster, None, ("cpu", "gpu"))
    single = best_single_type(reference)
    by_kind = single_kind_plans(reference)
    assert cost_model.throughput == cluster.throughput
    assert single is not None and by_kind["cpu"] is not None and by_kind["gpu"] is not None
    return {"mixed": plan, "single": single, "cpu": by_kind["cpu"], "gpu": by_kind["gpu"]}


def test_the_files_are_production_scale():
    profile, cluster = load_model_profile(PROFILE), load_cluster(CLUSTER)
    tables = sum(layer.param_bytes for layer in profile.layers if layer.kind == "sparse")
    assert tables > 6e11  # 882,774,559 rows x 64 x fp32 x 3 (Adam): more than any one unit holds
    assert all(t.memory < tables for t in cluster.resource_types)
    assert {t.kind for t in cluster.resource_types} == {"cpu", "gpu"}


def test_the_mixed_plan_is_strictly_cheaper_than_any_single_type(what_if):
    mixed = what_if["mixed"]
    assert mixed.feasible and mixed.throughput >= mixed.required_throughput
    assert {stage.kind for stage in mixed.stages} == {"cpu", "gpu"}
    assert mixed.stages[0].kind == "cpu"  # the runtime's rule: the CPU trainers read the data
    assert mixed.cost_per_hour < what_if["single"].cost_per_hour
    assert what_if["single"].cost_per_hour <= min(what_if["cpu"].cost_per_hour, what_if["gpu"].cost_per_hour)


def _readme_section() -> str:
    with open(os.path.join(REPO, "README.md"), encoding="utf-8") as handle:
        text = handle.read()
    start = text.index("### What-if: where a mixed cluster pays")
    return text[start : text.index("\n## ", start)]


def test_the_readme_quotes_what_heterps_plan_prints(what_if, capsys):
    code, out, _ = run_cli(capsys, *COMMAND.split()[1:])
    assert code == 0
    section = re.sub(r"\s+", " ", _readme_section())  # the README wraps its lines anywhere
    assert COMMAND in section
    # Each cost as the report prints it (4 significant figures, per hour), and the README gives the same text.
    for key in ("mixed", "single", "cpu", "gpu"):
        cost = f"{what_if[key].cost_per_hour:.4g}/h"
        assert cost in out and cost in section, key
    single, cpu, gpu = (what_if["mixed"].cost_per_hour / what_if[key].cost_per_hour for key in ("single", "cpu", "gpu"))
    ratios = f"{single:.3f}x the best single-type plan, {cpu:.3f}x all-CPU, {gpu:.3f}x all-GPU"
    assert f"heterogeneous plan costs {ratios}" in out
    assert ratios in section
    # The README names the types of each plan, as the report does.
    for stage in what_if["mixed"].stages:
        assert f"{stage.units} {stage.resource}" in section
    for key in ("single", "cpu", "gpu"):
        stage = what_if[key].stages[0]
        assert f"{stage.units} {stage.resource}" in section, key
