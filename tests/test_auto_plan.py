"""The automatic path: ``strategy.heterps`` with a cluster plans inside ``minimize``, within the launch, once per
launch, the same way on every launch; a split it chooses runs and learns."""

import json
import os
import subprocess

import pytest
from conftest import heterps_cli, split_cluster

from heterps_paddle.tools.jobs import JobSpec, run_job

# A what-if cluster whose figures make the split optimal whatever this machine's load: every time is estimated
# (no local type); the fc layers are slow on the CPU type and fast on the GPU type, whose memory cannot hold the
# embedding table (1M rows x 9 with Adam's state), so at this target only embedding on cpu_small + fc on gpu_fast
# meets it.
SPLIT_CLUSTER = split_cluster(cpu_units=4, gpu_units=4, throughput=20000)
SMALL = {
    "generate_rows": 40_000,
    "epochs": 2,
    "batch_size": 128,
    "print_period": 1000,
    "model_config": {"sparse_feature_dim": 9, "fc_sizes": [64, 64], "learning_rate": 0.003},
}


@pytest.fixture(scope="module")
def local_cluster(tmp_path_factory):
    from heterps_paddle.measure.local_cluster import detect_local_cluster
    from heterps_paddle.planning.model import cluster_to_dict, save_yaml

    path = str(tmp_path_factory.mktemp("cluster") / "local.yaml")
    save_yaml(cluster_to_dict(detect_local_cluster()), path)
    return path


def worker_logs(log_dir, prefixes=("workerlog", "heterlog")):
    return {
        name: open(os.path.join(log_dir, name), errors="replace").read()
        for name in sorted(os.listdir(log_dir))
        if name.startswith(prefixes)
    }


@pytest.mark.launched
def test_launched_job_plans_within_its_launch_and_unused_trainers_leave(tmp_path, heterps_cache, local_cluster):
    out_dir = tmp_path / "plan"
    # A target the 2 CPU trainers meet: one stage on them is cheaper than using the launched heterogeneous
    # trainer too (2 units against 3), so the plan fits the launch and that trainer leaves.
    spec = JobSpec(
        model="ctr_dnn",
        heterps=True,
        servers=1,
        workers=2,
        timeout=400,
        overrides={"generate_rows": 60_000, "epochs": 2},
        launch_args=("--heter_worker_num=1", "--heter_devices=cpu"),
        heterps_configs={"cluster": local_cluster, "throughput": 200, "scheduler": "exact", "output_dir": str(out_dir)},
    )
    result = run_job(spec, str(tmp_path / "job"))
    assert result.test_auc >= 0.70, result.summary()
    plan = json.load(open(out_dir / "plan.json"))
    assert plan["feasible"] and plan["scheduler"] == "launch-fit"
    assert [(s["resource"], s["kind"], s["units"]) for s in plan["stages"]] == [("local_cpu", "cpu", 2)]
    assert plan["launch"] == {"worker_num": 2, "heter_worker_num": [1], "heter_devices": ["cpu"], "server_num": 1}
    assert plan["inputs_digest"]
    report = open(out_dir / "plan_report.txt").read()
    assert report.index("WHAT RUNS") < report.index("OTHER LAUNCHES") < report.index("SINGLE-TYPE ALTERNATIVES")
    assert "launched: 1 server, 2 CPU trainers, stage 2: 1 heterogeneous trainer (on cpu)" in report
    assert "run nothing" in report and "target 200 samples/s: met" in report
    assert "cheaper at 200 samples/s" in report and "--worker_num=1" in report  # one trainer would do
    assert "local_gpu stands in for a GPU on this machine's cores" in report
    logs = worker_logs(result.log_dir, ("workerlog", "heterlog", "serverlog"))
    assert "heterogeneous trainer not used by the plan" in logs["heterlog.0"]
    # the local CPU type's sparse layer carries the servers' work per row (ps_service probe), the local GPU
    # type's (the project's table, synced per pass) does not: 26 slots of one row each per sample
    from heterps_paddle.measure.ps_service import ps_row_cost
    from heterps_paddle.planning.model import load_model_profile

    embedding = load_model_profile(str(out_dir / "profile.yaml")).layers[0]
    row_seconds = ps_row_cost().row_seconds  # cached: the figure the plan used
    assert row_seconds > 0 and "us CPU per row" in report
    assert embedding.time["local_cpu"] - embedding.time["local_gpu"] == pytest.approx(26 * row_seconds, rel=1e-6)
    # one plan per launch: made by one process, read by the others (servers wait for it)
    made = [n for n, log in logs.items() if "heterps: plan planned:" in log]
    shared = [n for n, log in logs.items() if "heterps: plan shared:" in log]
    assert len(made) == 1 and len(shared) == 2, (made, shared)
    assert "parameter server: runs plan" in logs["serverlog.0"]


@pytest.mark.launched
def test_a_split_chosen_by_the_automatic_path_runs_learns_and_is_planned_again_the_same(tmp_path, heterps_cache):
    cluster = tmp_path / "cluster.yaml"
    cluster.write_text(SPLIT_CLUSTER)
    cli = heterps_cli()
    subprocess.run(cli + ["profile", "--example", "ctr_dnn", "--out", str(tmp_path / "profile.yaml")], check=True)
    subprocess.run(
        cli
        + [
            "plan",
            "--model",
            str(tmp_path / "profile.yaml"),
            "--cluster",
            str(cluster),
            "--scheduler",
            "exact",
            "--out",
            str(tmp_path / "advised.json"),
        ],
        check=True,
    )
    launch_args = subprocess.run(
        cli + ["launch-args", str(tmp_path / "advised.json")], check=True, capture_output=True, text=True
    ).stdout.split()
    assert launch_args == ["--server_num=1", "--worker_num=1", "--heter_worker_num=1", "--heter_devices=cpu"]

    out_dir = tmp_path / "plan"
    configs = {"cluster": str(cluster), "throughput": 20000, "output_dir": str(out_dir)}
    spec = JobSpec(
        heterps=True,
        servers=1,
        workers=1,
        timeout=400,
        overrides=SMALL,
        heterps_configs=configs,
        launch_args=tuple(launch_args[2:]),
    )
    first = run_job(spec, str(tmp_path / "first"))
    plan = json.load(open(out_dir / "plan.json"))
    assert [(s["resource"], s["layers"]) for s in plan["stages"]] == [
        ("cpu_small", ["embedding_0"]),
        ("gpu_fast", ["fc_0", "fc_1", "fc_2"]),
    ]
    report = open(out_dir / "plan_report.txt").read()
    assert "2 stages, pipelined" in report and "target 20,000 samples/s: met" in report
    logs = worker_logs(first.log_dir)
    assert "heterogeneous trainer taken over (stage 2)" in logs["heterlog.0"]
    assert first.test_auc >= 0.70, first.summary()

    # The same job launched again: the same plan, reused from the plan file (same inputs digest).
    second = run_job(JobSpec(**{**spec.__dict__, "overrides": {**SMALL, "epochs": 1}}), str(tmp_path / "second"))
    again = json.load(open(out_dir / "plan.json"))
    assert again == plan
    # one process of the launch found it (same inputs digest), the others read what it found
    told = [log for log in worker_logs(second.log_dir).values() if "heterps: plan reused:" in log]
    assert len(told) == 1
    assert second.test_auc >= 0.65, second.summary()


def test_program_digest_names_the_computation_not_the_build(tmp_path):
    import paddle

    from heterps_paddle.examples import build_program
    from heterps_paddle.program.job_profile import program_digest

    def digest(**config):
        with paddle.utils.unique_name.guard():  # names as a new process (a new launch) makes them
            return program_digest(build_program("ctr_dnn", **config)[0])

    paddle.enable_static()
    assert digest(fc_sizes=(8,)) == digest(fc_sizes=(8,)) != digest(fc_sizes=(16,))
