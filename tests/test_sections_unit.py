"""Sections without launching: the plan, the launch arguments, op tagging, and probes of the Paddle
2.6.2 internals the fixes depend on (they fail loudly when Paddle behaves differently)."""

import json
import socket
import subprocess
import sys

import pytest

from heterps_paddle.planning.model import PlanningInputError, plan_from_dict

STAGES3 = [
    {"resource": "cpu_16", "kind": "cpu", "layers": ["embedding_0"], "units": 2},
    {"resource": "gpu_a100", "kind": "gpu", "layers": ["fc_0"], "units": 1},
    {"resource": "cpu_64", "kind": "cpu", "layers": ["fc_1", "fc_2"], "units": 3},
]


def _write(tmp_path, obj, name="plan.json"):
    p = tmp_path / name
    p.write_text(json.dumps(obj))
    return str(p)


def test_launch_args_command(tmp_path):
    path = _write(tmp_path, {"format": 1, "feasible": True, "stages": STAGES3})
    run = subprocess.run(
        [sys.executable, "-m", "heterps_paddle", "launch-args", path, "--devices", "plan", "--server-num", "2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [
        "--server_num=2",
        "--worker_num=2",
        "--heter_worker_num=1;3",
        "--heter_devices=gpu;cpu",
    ]
    bad = subprocess.run(
        [sys.executable, "-m", "heterps_paddle", "launch-args", str(tmp_path / "nope.json")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == 2 and "does not exist" in bad.stderr
    gpu_first = _write(
        tmp_path,
        {"format": 1, "feasible": True, "stages": [{**STAGES3[1], "layers": ["a"]}, {**STAGES3[0], "layers": ["b"]}]},
    )
    refused = subprocess.run(
        [sys.executable, "-m", "heterps_paddle", "launch-args", gpu_first], capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 2 and "must be a cpu stage" in refused.stderr


def _ctr_program(plan_stages, tmp_path):
    import paddle

    from heterps_paddle.examples import build_net
    from heterps_paddle.examples.common import ModelConfig
    from heterps_paddle.program.partition import tag_program

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        model = build_net("ctr_dnn", ModelConfig(fc_sizes=(16, 16), embedding="ps"))
        plan = plan_from_dict({"format": 1, "feasible": True, "stages": plan_stages})
        layer_stage = tag_program(main, plan)
        # backward only: in a PS job the optimizer ops are deleted (run on the servers) before the split
        paddle.static.append_backward(model.loss)
    return main, layer_stage


@pytest.mark.parametrize("stages", [2, 3])
def test_tags_survive_backward_and_paddle_cuts_2n_minus_1_runs(tmp_path, stages):
    # Paddle's splitter (ps/utils/public.py: find_heter_ops, private) must see forward 1..N then backward
    # N-1..1; the builder refuses to split otherwise, and this probe says so before any job runs.
    from heterps_paddle.runtime.heter_builder import _fill_untagged_ops, device_runs

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
    with pytest.raises(
        PlanningInputError, match=r"not placed by the plan: \['fc_1', 'fc_2'\].*not in the program: \['fc_9'\]"
    ):
        _ctr_program(bad, tmp_path)


def test_paddle_heter_sparse_key_bug_is_still_there_and_fixed(tmp_path):
    # Fix 4 exists because Paddle keys heter pull ops as param + Ids[0][0] and grad ops as param. If
    # Paddle fixes that, this fails: drop the override then.
    from paddle.distributed.passes.ps_trainer_pass import DistributedOpsPass

    from heterps_paddle.runtime.heter_builder import _FixedDistributedOpsPass

    main, _ = _ctr_program([STAGES3[0], {**STAGES3[1], "layers": ["fc_0", "fc_1", "fc_2"]}], tmp_path)
    attrs = {"is_heter_ps_mode": True, "is_fl_ps_mode": False, "local_sparse": []}
    pull, push, _ = DistributedOpsPass()._get_pull_sparse_ops(main, attrs)
    assert list(pull) == ["SparseFeatFactorsC"] and push == {}, (list(pull), list(push))
    pull, push, _ = _FixedDistributedOpsPass()._get_pull_sparse_ops(main, attrs)
    assert list(push) == list(pull) and len(push["SparseFeatFactorsC"]) == 26


def test_paddle_remove_var_pair_bug_is_still_there_and_fixed():
    # Fix 1: merged_*_pairs hold one list per program; Paddle's method indexes them as pairs.
    from paddle.distributed.passes.ps_trainer_pass import SplitTrainerOpsPass

    from heterps_paddle.runtime.heter_builder import _FixedSplitTrainerOpsPass

    class Merged:
        def __init__(self, name):
            self.merged_var = type("V", (), {"name": name})()

    def attrs():
        pairs = [[(Merged("w"), Merged("w@GRAD")), (Merged("b"), Merged("b@GRAD"))]]
        return {
            "merged_variables_pairs": [list(p) for p in pairs],
            "merged_dense_pairs": [list(p) for p in pairs],
            "merged_sparse_pairs": [[]],
        }

    with pytest.raises(AttributeError):
        SplitTrainerOpsPass()._remove_var_pair_by_grad("w@GRAD", attrs())
    a = attrs()
    _FixedSplitTrainerOpsPass()._remove_var_pair_by_grad("w@GRAD", a)
    assert [p[1].merged_var.name for p in a["merged_dense_pairs"][0]] == ["b@GRAD"]


def test_seam_installs_the_fixed_builder_after_checking_paddle():
    code = (
        "import paddle.distributed.fleet; from heterps_paddle.runtime import heter_builder, patches, seam; "
        "from paddle.distributed.ps.utils import ps_factory; assert seam.paddle_shape_problems() == []; "
        "patches.install(); assert ps_factory.HeterAsyncPsProgramBuilder is heter_builder.FixedHeterProgramBuilder; "
        "import inspect; src = inspect.getsource(ps_factory); "
        "assert \"globals()['HeterAsyncPsProgramBuilder'](pass_ctx)\" in src; print('ok')"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]


def test_seam_refuses_another_paddle_with_what_differs(monkeypatch):
    import paddle

    from heterps_paddle.runtime import seam

    monkeypatch.setattr(paddle, "__version__", "3.1.1")
    with pytest.raises(seam.PaddleBehaviourChanged, match=r"paddle 3.1.1 \(heterps-paddle supports 2.6.x\)"):
        seam.check_paddle()


def test_heterps_launch_patches_start_ps_only_while_paddles_launcher_runs():
    from paddle.distributed.fleet import launch_utils

    from heterps_paddle.runtime import patches

    launcher_cls = launch_utils.ParameterServerLauncher
    original = launcher_cls.start_ps
    attached = []
    with pytest.raises(KeyError):
        with patches.supervised_launcher(attached.append):
            assert launcher_cls.start_ps is not original
            launcher = object.__new__(launcher_cls)
            with pytest.raises(AttributeError):
                launcher_cls.start_ps(launcher)  # the supervisor hears of it first, then Paddle's start_ps runs
            assert attached == [launcher]
            raise KeyError("Paddle's launcher failed")
    assert launcher_cls.start_ps is original  # restored, also when the launch raised


def test_watchdog_names_a_dead_and_a_missing_peer():
    from heterps_paddle.runtime.watchdog import FATAL_TAG, Watchdog

    live = socket.socket()
    live.bind(("127.0.0.1", 0))
    live.listen()
    ep_live = f"127.0.0.1:{live.getsockname()[1]}"
    closed = socket.socket()
    closed.bind(("127.0.0.1", 0))
    ep_missing = f"127.0.0.1:{closed.getsockname()[1]}"
    closed.close()
    dog = Watchdog(
        [("stage 2 heterogeneous trainer 0", ep_live), ("stage 3 heterogeneous trainer 0", ep_missing)],
        me="stage 1 CPU trainer 0",
        startup_timeout=0.0,
        misses=2,
        on_fatal=lambda m: None,
    )
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


class _Proc:
    """A stand-in for one of Paddle's launcher's TrainerProc (its Popen and log)."""

    def __init__(self, code, pid=7, log=None):
        self.proc = type("P", (), {"poll": lambda self: code, "pid": pid})()
        self.log_fn = type("F", (), {"name": log})() if log else None
        self.stage = None


def _supervisor(procs):
    from heterps_paddle.launch.supervisor import Supervisor

    sup = Supervisor(timeout=None)
    sup.launcher = type("L", (), {"procs": procs, "stage_list": [2]})()
    return sup


def test_supervisor_tells_a_clean_end_from_a_failure():
    ok = _supervisor({"worker": [_Proc(None), _Proc(0)], "server": [_Proc(None)], "heter_worker": [_Proc(None)]})
    assert ok.check_once() is None  # one trainer finished, the rest still work
    failed = _supervisor({"worker": [_Proc(None), _Proc(1, log="log/workerlog.1")], "server": [_Proc(None)]})
    assert failed.check_once().message == "CPU trainer 1 (pid 7, log log/workerlog.1) exited with status 1"
    server_died = _supervisor({"worker": [_Proc(None)], "server": [_Proc(-9)]})
    assert "parameter server 0 (pid 7) was killed by SIGKILL while the CPU trainers" in server_died.check_once().message
    heter_died = _supervisor({"worker": [_Proc(None)], "heter_worker": [_Proc(-11)]})
    assert "stage 2 heterogeneous trainer 0 (pid 7) was killed by SIGSEGV" in heter_died.check_once().message
    # found dead together: the one the others depend on is named first
    both = _supervisor({"worker": [_Proc(-6, log="w1"), _Proc(None)], "heter_worker": [_Proc(-9, log="h0")]})
    failure = both.check_once()
    assert failure.message.startswith("stage 2 heterogeneous trainer 0 (pid 7, log h0) was killed by SIGKILL")
    assert "; then CPU trainer 0 (pid 7, log w1) was killed by SIGABRT" in failure.message and failure.log == "h0"
    # a heterogeneous trainer that leaves by itself (unused, or done serving) is fine; so is everything that
    # Paddle's launcher stops after the trainers finished
    assert _supervisor({"worker": [_Proc(None)], "heter_worker": [_Proc(0)]}).check_once() is None
    assert (
        _supervisor({"worker": [_Proc(0)], "server": [_Proc(-15)], "heter_worker": [_Proc(-15)]}).check_once() is None
    )


def test_after_the_launcher_a_host_without_trainers_fails_on_a_bad_end_while_the_job_runs():
    """Across hosts, Paddle's launcher on a host with only a heterogeneous trainer returns as soon as that process
    ends: a bad end while the job still runs fails the host (it is the job's failure), a clean one does not."""
    import threading

    def host(code, job_ended):
        sup = _supervisor({"heter_worker": [_Proc(code, log="h0")]})
        ended = threading.Event()
        if job_ended:
            ended.set()
        sup.member = type("M", (), {"ended": ended})()
        return sup

    failure = host(1, job_ended=False).after_the_launcher()
    assert failure is not None and failure.message.startswith("stage 2 heterogeneous trainer 0 (pid 7, log h0)")
    assert "exited with status 1 while the CPU trainers were still running" in failure.message
    assert "was killed by SIGKILL" in host(-9, job_ended=False).after_the_launcher().message
    assert host(0, job_ended=False).after_the_launcher() is None  # left by itself (unused by the plan)
    assert host(-15, job_ended=True).after_the_launcher() is None  # stopped at the job's end
    # one host: the trainers decide, as before
    assert _supervisor({"worker": [_Proc(0)], "heter_worker": [_Proc(-15)]}).after_the_launcher() is None
    failed = _supervisor({"worker": [_Proc(1, log="w0")], "heter_worker": [_Proc(-15)]}).after_the_launcher()
    assert failed.message == "CPU trainer 0 (pid 7, log w0) exited with status 1"


def test_launch_options_split_from_paddles(tmp_path):
    from heterps_paddle.launch.options import parse
    from heterps_paddle.launch.paddle_round import launch_description

    train = tmp_path / "t.py"
    train.write_text("")
    options = parse(["--timeout", "30", "--server_num=1", "--quiet", "--worker_num=2", str(train), "--quiet"])
    assert options.timeout == 30 and options.quiet and options.script_args == ("--quiet",)
    assert options.launcher_argv() == ["--server_num=1", "--worker_num=2", str(train), "--quiet"]
    argv = ["--server_num=1", "--worker_num=2", "--heter_worker_num=1;2", "--heter_devices=gpu;cpu", str(train), "-x"]
    args = parse(argv).paddle_arguments()
    assert args.training_script == str(train) and args.training_script_args == ["-x"]
    assert launch_description(args) == {
        "worker_num": 2,
        "server_num": 1,
        "heter_worker_num": [1, 2],
        "heter_devices": ["gpu", "cpu"],
    }


def test_minimize_groups_the_program_once_for_the_passes_that_read_layers(monkeypatch):
    # The meta optimizer groups the program and checks the plan once (planned_layers) and hands the layers to
    # the split tags and to the GPU-stage embeddings; neither regroups.  A one-stage CPU plan needs no layers.
    import paddle

    from heterps_paddle.examples import build_net
    from heterps_paddle.examples.common import ModelConfig
    from heterps_paddle.program import partition
    from heterps_paddle.runtime.gpu_embedding import gpu_sparse_layers

    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        build_net("ctr_dnn", ModelConfig(fc_sizes=(16, 16), embedding="ps"))
    groupings = []
    group_layers = partition.group_layers
    monkeypatch.setattr(partition, "group_layers", lambda *a, **k: groupings.append(1) or group_layers(*a, **k))
    plan = plan_from_dict({"format": 1, "feasible": True, "stages": STAGES3})
    layers = partition.planned_layers(main, plan)
    assert layers is not None and len(groupings) == 1
    assert partition.tag_program(main, plan, layers)["fc_0"] == 2
    assert gpu_sparse_layers(main, plan, layers) == []  # the GPU stage holds fc_0 only
    assert len(groupings) == 1
    one_cpu = plan_from_dict(
        {"format": 1, "feasible": True, "stages": [{**STAGES3[0], "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"]}]}
    )
    assert partition.planned_layers(main, one_cpu) is None and len(groupings) == 1
    with pytest.raises(PlanningInputError, match="not placed by the plan"):
        partition.planned_layers(main, plan_from_dict({"format": 1, "feasible": True, "stages": STAGES3[:2]}))


def test_the_watchdog_names_who_holds_its_own_endpoint():
    """A port another process took before this one bound it: Paddle would wait forever; the watchdog names it."""
    import socket
    import subprocess
    import sys

    from heterps_paddle.launch.ports import claim_port_block
    from heterps_paddle.runtime.watchdog import Watchdog

    block = claim_port_block("127.0.0.1", 1)
    port = block.first
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import socket,time; s=socket.socket(); s.bind(('127.0.0.1',{port})); s.listen(); print('up',flush=True); "
            "time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "up"
        dog = Watchdog([], "CPU trainer 0", startup_timeout=0.0)
        dog.own_endpoint = f"127.0.0.1:{port}"
        assert dog.check_once() is None  # not expected to listen outside a pass
        dog.expect_own_listen()
        message = dog.check_once()
        assert message is not None and f"127.0.0.1:{port}" in message and f"pid {holder.pid}" in message
    finally:
        holder.kill()
        holder.wait()
    with socket.socket() as mine:
        mine.bind(("127.0.0.1", port))
        mine.listen()
        dog = Watchdog([], "CPU trainer 0", startup_timeout=0.0)
        dog.own_endpoint = f"127.0.0.1:{port}"
        dog.expect_own_listen()
        assert dog.check_once() is None  # this process listens: nothing to say
    block.release()


def test_a_heterogeneous_section_queues_its_dense_pushes_before_its_backward_message():
    # Fix 6 (runtime/heter_builder.py): Paddle appends the dense sends after the backward send_and_recv, so the first
    # stage could end its pass and a save pull before the last micro-batch's push was queued.
    import paddle

    from heterps_paddle.runtime.heter_builder import _push_before_backward_message

    paddle.enable_static()
    program = paddle.static.Program()
    block = program.global_block()
    grad = block.create_var(name="fc_0.w_0@GRAD", shape=[4, 2], dtype="float32")
    boundary = block.create_var(name="boundary@GRAD", shape=[8, 4], dtype="float32")
    dummy = block.create_var(name="send_dummy", shape=[1], dtype="float32")
    block.append_op(type="scale", inputs={"X": [boundary]}, outputs={"Out": [boundary]}, attrs={"scale": 1.0})
    block.append_op(
        type="send_and_recv",
        inputs={"X": [boundary]},
        outputs={"Out": []},
        attrs={
            "mode": "backward",
            "send_var_name": ["boundary@GRAD"],
            "recv_var_name": [],
            "message_name": "backward_joint_1_2@Heter",
            "next_endpoints": [],
            "previous_endpoints": ["127.0.0.1:1"],
            "trainer_id": 0,
        },
    )
    block.append_op(
        type="send",
        inputs={"X": [grad]},
        outputs={"Out": [dummy]},
        attrs={"is_sparse": 0, "table_id": 3, "send_varnames": ["Dense@GRAD_3"], "op_device": "gpu"},
    )
    block.append_op(type="send", inputs={"X": []}, outputs={"Out": [dummy]}, attrs={"is_sparse": 0, "table_id": 0})
    assert _push_before_backward_message(program) == 1
    kinds = [(op.type, op.input_arg_names) for op in block.ops]
    assert kinds == [
        ("scale", ["boundary@GRAD"]),
        ("send", ["fc_0.w_0@GRAD"]),
        ("send_and_recv", ["boundary@GRAD"]),
        ("send", []),  # the step counter's send stays where Paddle put it
    ]
    moved = block.ops[1]
    assert moved.attr("table_id") == 3 and moved.attr("send_varnames") == ["Dense@GRAD_3"]
    assert moved.attr("op_device") == "gpu" and moved.output("Out") == ["send_dummy"]
    assert _push_before_backward_message(program) == 0  # already in order
