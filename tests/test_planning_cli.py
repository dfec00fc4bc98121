"""`heterps plan` and `heterps bench scheduler` as a user runs them."""

import json
import os
import subprocess
import sys

import pytest
import yaml
from conftest import CLUSTER, plan_exact, run_cli

from heterps_paddle.planning.model import load_plan

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_plan_json_is_one_object_and_round_trips(capsys, model_file, tmp_path):
    out_path = str(tmp_path / "plan.json")
    code, out, _ = plan_exact(capsys, model_file, "--json", "--out", out_path)
    assert code == 0
    document = json.loads(out)  # exactly one JSON object: json.loads refuses trailing text
    assert document["format"] == 1 and document["feasible"] is True and document["scheduler"] == "exact"
    assert list(document["assignment"]) == ["embedding", "fc_0", "fc_1", "fc_2"]
    assert document["throughput"] >= 100000
    assert sum(len(s["layers"]) for s in document["stages"]) == 4
    assert document["cost_per_million_samples"] == pytest.approx(
        document["cost_per_hour"] / (3600 * document["throughput"]) * 1e6
    )
    assert load_plan(out_path).to_dict() == document


def test_plan_summary_shows_stages_and_the_best_single_type(capsys, model_file):
    code, out, _ = run_cli(capsys, "plan", "--model", model_file, "--cluster", CLUSTER, "--scheduler", "greedy")
    assert code == 0
    assert "stage" in out and "units" in out and "best single-type plan" in out


def test_plan_summary_prices_all_cpu_and_all_gpu(capsys, model_file):
    """Beside the best single type, the cheapest all-CPU and all-GPU plans and the plan's cost against each."""
    from heterps_paddle.planning.model import load_cluster, load_model_profile
    from heterps_paddle.planning.planner import launchable_cost_model, make_plans
    from heterps_paddle.planning.report import best_single_type, best_single_type_of_kind

    code, out, _ = run_cli(capsys, "plan", "--model", model_file, "--cluster", CLUSTER, "--scheduler", "exact")
    assert code == 0
    profile, cluster = load_model_profile(model_file), load_cluster(CLUSTER)
    model = launchable_cost_model(profile, cluster, None, ("cpu", "gpu"))
    plan = make_plans(profile, cluster, "exact", [None])[0][1]
    single = best_single_type(model)
    assert single is not None
    ratios = [f"{plan.cost_per_hour / single.cost_per_hour:.3f}x the best single-type plan"]
    for kind in ("cpu", "gpu"):
        alt = best_single_type_of_kind(model, kind)
        assert alt is not None and {s.kind for s in alt.stages} == {kind}
        units = sum(s.units for s in alt.stages)
        line = f"all-{kind.upper()} ({alt.stages[0].resource}): {units} unit{'s' * (units != 1)}, "
        assert line + f"{alt.throughput:,.0f} samples/s, {alt.cost_per_hour:.4g}/h" in out
        assert alt.cost_per_hour >= single.cost_per_hour
        ratios.append(f"{plan.cost_per_hour / alt.cost_per_hour:.3f}x all-{kind.upper()}")
    assert f"heterogeneous plan costs {', '.join(ratios)}" in out
    # Trainers that may only be CPUs: no all-GPU plan to weigh against (not "none meets the target").
    code, out, _ = plan_exact(capsys, model_file, "--trainer-kinds", "cpu")
    assert code == 0 and "all-CPU (" in out and "all-GPU" not in out


def test_infeasible_is_an_answer_with_exit_1(capsys, model_file):
    code, out, err = plan_exact(
        capsys,
        model_file,
        "--throughput",
        "1e12",
        "--json",
    )
    document = json.loads(out)  # still the answer, on stdout; the status says it is not a plan
    assert code == 1 and document["feasible"] is False and "reason" in document
    assert "no plan meets the target of 1,000,000,000,000 samples/s" in err


def test_invalid_input_exits_2_with_the_error_on_stderr(capsys, model_file, tmp_path):
    bad = tmp_path / "cluster.yaml"
    bad.write_text(yaml.safe_dump({"format": 1, "throughput": 1, "resource_types": [{"name": "x"}]}))
    code, out, err = run_cli(capsys, "plan", "--model", model_file, "--cluster", str(bad), "--json")
    assert code == 2 and out == "" and str(bad) in err and "missing required key" in err
    code, out, err = run_cli(capsys, "plan", "--model", model_file, "--cluster", CLUSTER, "--throughput", "fast")
    assert code == 2 and "--throughput" in err


def test_sweep_and_plot(capsys, model_file, tmp_path):
    plot = str(tmp_path / "sweep.png")
    code, out, _ = plan_exact(
        capsys,
        model_file,
        "--throughput",
        "1e4,5e4,1e5",
        "--json",
        "--plot",
        plot,
    )
    document = json.loads(out)
    assert code == 0 and [p["required_throughput"] for p in document["sweep"]] == [1e4, 5e4, 1e5]
    costs = [p["cost_per_hour"] for p in document["sweep"]]
    assert costs == sorted(costs)  # a higher target never costs less
    assert os.path.getsize(plot) > 1000


def test_plan_with_exact_never_imports_paddle(model_file):
    code = (
        "import sys; from heterps_paddle.tools.cli import main; "
        f"rc = main(['plan', '--model', {model_file!r}, '--cluster', {CLUSTER!r}, '--scheduler', 'exact', "
        "'--json']); assert 'paddle' not in sys.modules, 'paddle imported'; sys.exit(rc)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["feasible"] is True


def test_bench_scheduler_json(capsys, tmp_path):
    plot = str(tmp_path / "bench.png")
    code, out, _ = run_cli(
        capsys,
        "bench",
        "scheduler",
        "--count",
        "3",
        "--schedulers",
        "exact,greedy,brute,descent",
        "--no-examples",
        "--json",
        "--plot",
        plot,
    )
    document = json.loads(out)
    assert code == 0 and len(document["workloads"]) == 3
    assert document["summary"]["exact"]["worst_ratio"] == 1.0
    assert document["summary"]["greedy"]["median_ratio"] >= 1.0
    # rl's refinement alone (not a scheduler): a feasible plan, never below the proven optimum
    assert document["summary"]["descent"]["no_plan"] == 0
    assert document["summary"]["descent"]["median_ratio"] >= 1.0 - 1e-9
    assert os.path.getsize(plot) > 1000


@pytest.mark.parametrize("target", ["1e300", "1e20"])
def test_a_target_beyond_any_cluster_is_infeasible_not_a_crash(capsys, model_file, target):
    # units for 1e300 samples/s do not fit an int64 (it was an OverflowError in the cost model)
    code, out, err = run_cli(
        capsys, "plan", "--model", model_file, "--cluster", CLUSTER, "--scheduler", "greedy", "--throughput", target
    )
    assert code == 1, err
    assert f"no plan meets the target of {float(target):.3g} samples/s" in err or "target of 100,000" in err, err
