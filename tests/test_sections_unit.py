"""Sections without launching: the plan, the launch arguments, op tagging, and probes of the Paddle
2.6.2 internals the fixes depend on (they fail loudly when Paddle behaves differently)."""

import json
import socket
import subprocess
import sys

import pytest

from heterps_paddle.runtime.plan import (LaunchMismatchError, PlanError, check_launch_matches,
                                          launch_arguments, load_plan)

STAGES3 = [{"resource": "cpu_16", "layers": ["embedding_0"], "units": 2},
           {"resource": "gpu_a100", "layers": ["fc_0"], "units": 1},
           {"resource": "cpu_64", "layers": ["fc_1", "fc_2"], "units": 3}]


def _write(tmp_path, obj, name="plan.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def test_launch_arguments_follow_the_plan(tmp_path):
    plan = load_plan(_write(tmp_path, {"format": 1, "stages": STAGES3}))
    assert [s.kind for s in plan.stages] == ["cpu", "gpu", "cpu"]
    assert launch_arguments(plan, 1, gpu_available=False) == [
        "--server_num=1", "--worker_num=2", "--heter_worker_num=1;3", "--heter_devices=cpu;cpu"]
    assert launch_arguments(plan, 2, gpu_available=True)[-1] == "--heter_devices=gpu;cpu"


def test_cluster_file_decides_the_kind(tmp_path):
    cluster = tmp_path / "cluster.json"
    cluster.write_text(json.dumps({"resource_types": [{"name": "cpu_16", "kind": "cpu"},
                                                      {"name": "gpu_a100", "kind": "cpu"},
                                                      {"name": "cpu_64", "kind": "gpu"}]}))
    plan = load_plan(_write(tmp_path, {"stages": STAGES3}), str(cluster))
    assert [s.kind for s in plan.stages] == ["cpu", "cpu", "gpu"]


@pytest.mark.parametrize("plan,needle", [
    ({"stages": []}, "non-empty list"),
    ({"stages": [{"resource": "gpu_x", "layers": ["a"], "units": 1},
                 {"resource": "cpu", "layers": ["b"], "units": 1}]}, "must be a CPU stage"),
    ({"stages": [{"resource": "cpu", "layers": ["a"], "units": 0}]}, "positive integer"),
    ({"stages": [{"resource": "cpu", "layers": ["a"], "units": 1},
                 {"resource": "gpu", "layers": ["a"], "units": 1}]}, "more than one stage"),
    ({"feasible": False, "reason": "too slow", "stages": []}, "infeasible"),
    ({"stages": [{"resource": "cpu", "units": 1}]}, "missing key 'layers'"),
])
def test_bad_plans_are_refused_with_the_reason(tmp_path, plan, needle):
    with pytest.raises(PlanError, match=needle):
        load_plan(_write(tmp_path, plan))


def test_plan_made_by_heterps_plan_loads(tmp_path):
    # The shape `heterps plan --json --out` writes (specs/plan-io.md), extra keys included; a one-stage
    # plan (here all on a GPU type) runs unsplit on the CPU trainers.
    plan = load_plan(_write(tmp_path, {
        "format": 1, "scheduler": "exact", "model": "ctr_dnn", "feasible": True,
        "assignment": {"embedding_0": "gpu_t4", "fc_0": "gpu_t4"},
        "stages": [{"resource": "gpu_t4", "layers": ["embedding_0", "fc_0"], "units": 3,
                    "time_per_sample": 7.8e-07, "throughput": 1274898.9}],
        "throughput": 1274898.9, "cost_per_hour": 0.526}))
    assert plan.num_stages == 1 and launch_arguments(plan, 1, False) == ["--server_num=1", "--worker_num=3"]


def test_launch_mismatch_names_what_the_plan_expects(tmp_path):
    plan = load_plan(_write(tmp_path, {"stages": STAGES3}))
    good = {"TRAINING_ROLE": "TRAINER", "STAGE_NUM": "3", "PADDLE_STAGE_TRAINERS_NUM": "[2, '1', '3']"}
    check_launch_matches(plan, good)
    with pytest.raises(LaunchMismatchError, match=r"expects 3 stages with \[2, 1, 3\].*--worker_num=2"):
        check_launch_matches(plan, {**good, "PADDLE_STAGE_TRAINERS_NUM": "[2, '1', '1']"})
    with pytest.raises(LaunchMismatchError, match="without heterogeneous trainers"):
        check_launch_matches(plan, {"TRAINING_ROLE": "TRAINER"})


def test_launch_args_command(tmp_path):
    path = _write(tmp_path, {"stages": STAGES3})
    run = subprocess.run([sys.executable, "-m", "heterps_paddle", "launch-args", path, "--devices", "plan",
                          "--server-num", "2"], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["--server_num=2", "--worker_num=2", "--heter_worker_num=1;3",
                                  "--heter_devices=gpu;cpu"]
    bad = subprocess.run([sys.executable, "-m", "heterps_paddle", "launch-args", str(tmp_path / "nope.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "does not exist" in bad.stderr


def _ctr_program(plan_stages, tmp_path):
    import paddle

    from heterps_paddle.examples import build_net
    from heterps_paddle.examples.common import ModelConfig
    from heterps_paddle.program.partition import tag_program

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        model = build_net("ctr_dnn", ModelConfig(fc_sizes=(16, 16), embedding="ps"))
        plan = load_plan(_write(tmp_path, {"stages": plan_stages}))
        layer_stage = tag_program(main, plan)
        # backward only: in a PS job the optimizer ops are deleted (run on the servers) before the split
        paddle.static.append_backward(model.loss)
    return main, layer_stage


@pytest.mark.parametrize("stages", [2, 3])
def test_tags_survive_backward_and_paddle_cuts_2n_minus_1_runs(tmp_path, stages):
    # Paddle's splitter (ps/utils/public.py: find_heter_ops, private) must see forward 1..N then backward
    # N-1..1; the builder refuses to split otherwise, and this probe says so before any job runs.
    from heterps_paddle.runtime.paddle_fixes import _fill_untagged_ops, device_runs

    plan = STAGES3 if stages == 3 else [STAGES3[0], {**STAGES3[1], "layers": ["fc_0", "fc_1", "fc_2"]}]
    main, layer_stage = _ctr_program(plan, tmp_path)
    assert layer_stage["embedding_0"] == 1 and layer_stage["fc_2"] == stages
    _fill_untagged_ops(main.global_block())
    runs = device_runs(main)
    assert len(runs) == 2 * stages - 1, [(d, n) for d, n, _ in runs]
    assert runs[0][0] == "cpu" and "lookup_table" in runs[0][2]
    assert "softmax_with_cross_entropy" in runs[stages - 1][2]


def test_plan_must_name_the_programs_layers(tmp_path):
    bad = [STAGES3[0], {**STAGES3[1], "layers": ["fc_0", "fc_9"]}]
    with pytest.raises(PlanError, match=r"not placed by the plan: \['fc_1', 'fc_2'\].*not in the program: \['fc_9'\]"):
        _ctr_program(bad, tmp_path)


def test_paddle_heter_sparse_key_bug_is_still_there_and_fixed(tmp_path):
    # Fix 4 exists because Paddle keys heter pull ops as param + Ids[0][0] and grad ops as param. If
    # Paddle fixes that, this fails: drop the override then.
    from paddle.distributed.passes.ps_trainer_pass import DistributedOpsPass

    from heterps_paddle.runtime.paddle_fixes import _FixedDistributedOpsPass

    main, _ = _ctr_program([STAGES3[0], {**STAGES3[1], "layers": ["fc_0", "fc_1", "fc_2"]}], tmp_path)
    attrs = {"is_heter_ps_mode": True, "is_fl_ps_mode": False, "local_sparse": []}
    pull, push, _ = DistributedOpsPass()._get_pull_sparse_ops(main, attrs)
    assert list(pull) == ["SparseFeatFactorsC"] and push == {}, (list(pull), list(push))
    pull, push, _ = _FixedDistributedOpsPass()._get_pull_sparse_ops(main, attrs)
    assert list(push) == list(pull) and len(push["SparseFeatFactorsC"]) == 26


def test_paddle_remove_var_pair_bug_is_still_there_and_fixed():
    # Fix 1: merged_*_pairs hold one list per program; Paddle's method indexes them as pairs.
    from paddle.distributed.passes.ps_trainer_pass import SplitTrainerOpsPass

    from heterps_paddle.runtime.paddle_fixes import _FixedSplitTrainerOpsPass

    class Merged:
        def __init__(self, name):
            self.merged_var = type("V", (), {"name": name})()

    def attrs():
        pairs = [[(Merged("w"), Merged("w@GRAD")), (Merged("b"), Merged("b@GRAD"))]]
        return {"merged_variables_pairs": [list(p) for p in pairs], "merged_dense_pairs": [list(p) for p in pairs],
                "merged_sparse_pairs": [[]]}

    with pytest.raises(AttributeError):
        SplitTrainerOpsPass()._remove_var_pair_by_grad("w@GRAD", attrs())
    a = attrs()
    _FixedSplitTrainerOpsPass()._remove_var_pair_by_grad("w@GRAD", a)
    assert [p[1].merged_var.name for p in a["merged_dense_pairs"][0]] == ["b@GRAD"]


def test_builder_factory_uses_the_fixed_builder():
    from paddle.distributed.ps.utils import ps_factory

    from heterps_paddle.runtime import paddle_fixes

    paddle_fixes.install()

    class Ctx:
        _attrs = {"ps_mode": None, "use_ps_gpu": False, "is_heter_ps_mode": True, "is_fl_ps_mode": False}

    # The factory looks the builder up by name in its module globals; construct only the class lookup.
    assert ps_factory.HeterAsyncPsProgramBuilder is paddle_fixes.FixedHeterProgramBuilder
    src = open(ps_factory.__file__).read()
    assert "globals()['HeterAsyncPsProgramBuilder'](pass_ctx)" in src


def test_watchdog_names_a_dead_and_a_missing_peer():
    from heterps_paddle.runtime.sections import FATAL_TAG, Watchdog

    live = socket.socket()
    live.bind(("127.0.0.1", 0))
    live.listen()
    ep_live = f"127.0.0.1:{live.getsockname()[1]}"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    ep_missing = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    dog = Watchdog([("stage 2 heterogeneous trainer 0", ep_live), ("stage 3 heterogeneous trainer 0", ep_missing)],
                   startup_timeout=0.0, misses=2, on_fatal=lambda m: None)
    msg = dog.check_once()
    assert FATAL_TAG in msg and "stage 3 heterogeneous trainer 0 never started" in msg
    dog.startup_timeout = 1e9
    assert dog.check_once() is None
    live.close()
    assert dog.check_once() is None  # one miss is not death
    msg = dog.check_once()
    assert "stage 2 heterogeneous trainer 0 stopped answering" in msg
    dog.armed = False
    assert dog.check_once() is None


def test_scan_logs_tells_a_clean_end_from_a_death(tmp_path):
    from heterps_paddle.tools.section_launch import scan_logs

    (tmp_path / "workerlog.0").write_text("training\nheterps-job: heldout_auc=0.7\n")
    (tmp_path / "heterlog.0").write_text("work\nFatalError: `Termination signal` is detected\n"
                                         "  [SignalInfo: *** SIGTERM (@0x1) received by PID 1 ***]\n")
    (tmp_path / "serverlog.0").write_text("serving\n[SignalInfo: *** SIGTERM (@0x1) received]\n")
    assert scan_logs(str(tmp_path)) == []
    (tmp_path / "heterlog.0").write_text("work\nheterps: process: stage 2 heterogeneous trainer 0 h:1 (pid 5); "
                                         "watching 2 peers\nmore work\n")
    (tmp_path / "workerlog.0").write_text("Traceback (most recent call last):\n  File x\n    y\nValueError: boom\n")
    found = scan_logs(str(tmp_path))
    assert any("stage 2 heterogeneous trainer 0" in f and "ended before the job" in f for f in found), found
    assert any(f.endswith("ValueError: boom") for f in found), found
