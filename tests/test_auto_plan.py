"""The automatic path: strategy.heterps with a cluster file plans inside minimize, once per launch."""

import json
import os

import pytest

from heterps_paddle.tools.jobs import JobSpec, run_job


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    from heterps_paddle.measure.local_cluster import detect_local_cluster
    from heterps_paddle.planning.model import cluster_to_dict, save_yaml

    path = str(tmp_path_factory.mktemp("cluster") / "local.yaml")
    save_yaml(cluster_to_dict(detect_local_cluster()), path)
    return path


def test_launched_job_plans_once_and_learns(tmp_path, heterps_cache, local_cluster):
    out_dir = tmp_path / "plan"
    # a target one CPU trainer meets: the cheapest plan is one local_cpu stage, which this launch runs
    spec = JobSpec(model="ctr_dnn", heterps=True, servers=1, workers=2, timeout=400,
                   overrides={"generate_rows": 60_000, "epochs": 2},
                   heterps_configs={"cluster": local_cluster, "throughput": 200, "scheduler": "exact",
                                    "output_dir": str(out_dir)})
    result = run_job(spec, str(tmp_path / "job"))
    assert result.test_auc >= 0.70, result.summary()
    plan = json.load(open(out_dir / "plan.json"))
    assert plan["feasible"] and plan["scheduler"] == "exact"
    assert [s["resource"] for s in plan["stages"]] == ["local_cpu"]
    assert list(plan["assignment"]) == ["embedding_0", "fc_0", "fc_1", "fc_2", "fc_3"]
    report = open(out_dir / "plan_report.txt").read()
    assert "all-CPU (local_cpu)" in report and "all-GPU (local_gpu)" in report
    assert (out_dir / "profile.yaml").is_file()
    # the local CPU type's sparse layer carries the servers' work per row (ps_service probe), the local GPU
    # type's (the project's table, synced per pass) does not: 26 slots of one row each per sample
    from heterps_paddle.planning.model import load_model_profile
    from heterps_paddle.measure.ps_service import ps_row_cost

    embedding = load_model_profile(str(out_dir / "profile.yaml")).layers[0]
    row_seconds = ps_row_cost().row_seconds  # cached: the figure the plan used
    assert row_seconds > 0 and "us CPU per row" in report
    assert embedding.time["local_cpu"] - embedding.time["local_gpu"] == pytest.approx(26 * row_seconds, rel=1e-6)
    # every process of the launch printed the same plan: made once, read by the others
    logs = [open(os.path.join(result.log_dir, name)).read() for name in sorted(os.listdir(result.log_dir))
            if name.startswith(("workerlog", "serverlog"))]
    assert len(logs) == 3
    printed = {log.split("heterps: plan written to", 1)[1].split("profile:", 1)[0] for log in logs}
    assert len(printed) == 1
