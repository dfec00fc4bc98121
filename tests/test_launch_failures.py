"""A failed job fails: ``heterps launch`` (the README's launcher) ends non-zero within 60 s when any process of a
split job dies, names the process and its log, and leaves nothing running; a planning error fails the job too.

The job: the PaddleRec-style trainer with a 2-stage plan (1 server, 2 CPU trainers, 1 heterogeneous trainer), many
epochs, killed with SIGKILL once it trains.
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from heterps_paddle.data.generator import generate

pytestmark = pytest.mark.launched  # real parameter-server jobs

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "paddlerec_style_trainer.py")
SURFACE_S = 60
FAULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults")  # sitecustomize.py: injected aborts
PLAN = {
    "format": 1,
    "feasible": True,
    "stages": [
        {"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 2},
        {"resource": "local_gpu", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
    ],
}
LAUNCH = ["--server_num=1", "--worker_num=2", "--heter_worker_num=1", "--heter_devices=cpu"]


@pytest.fixture(scope="module")
def setup(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("launch-failures")
    generate(str(tmp / "data"), 8000, seed=5, test_fraction=0.1)
    plan = tmp / "plan.json"
    plan.write_text(json.dumps(PLAN))
    return tmp


def job_processes(marker):
    """Processes whose command line holds ``marker`` (each test's own output directory)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (proc.info["cmdline"] or [])):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return found


def start(setup, name, plan=None, epochs=200, env=None):
    out = str(setup / f"out_{name}")
    log_dir = str(setup / f"log_{name}")
    cmd = [
        sys.executable,
        "-m",
        "heterps_paddle.tools.launch",
        "--timeout",
        "400",
        *LAUNCH,
        "--log_dir",
        log_dir,
        SCRIPT,
        "--data",
        str(setup / "data"),
        "--out",
        out,
        "--epochs",
        str(epochs),
        "--plan",
        plan or str(setup / "plan.json"),
    ]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **(env or {})}
    )
    return proc, out, log_dir


def wait_for(log, pattern, proc, timeout=180):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before {pattern!r} appeared in {log}:\n{proc.stdout.read()[-3000:]}")
        if os.path.isfile(log) and re.search(pattern, open(log, errors="replace").read()):
            return
        time.sleep(0.2)
    raise AssertionError(f"{pattern!r} never appeared in {log}")


def role_of(proc):
    env = proc.environ()
    return env.get("TRAINING_ROLE"), env.get("PADDLE_TRAINER_ID")


@pytest.mark.parametrize(
    "victim,named",
    [
        (("TRAINER", "1"), r"CPU trainer 1 \(pid \d+, log .*workerlog\.1\) was killed by SIGKILL"),
        (
            ("HETER_TRAINER", None),
            r"stage 2 heterogeneous trainer 0 \(pid \d+, log .*heterlog\.0\) was killed by SIGKILL",
        ),
        (("PSERVER", None), r"parameter server 0 \(pid \d+, log .*serverlog\.0\) was killed by SIGKILL"),
    ],
    ids=["cpu-trainer", "heter-trainer", "server"],
)
def test_a_killed_process_fails_the_job_fast_and_leaves_nothing(setup, victim, named):
    name = victim[0].lower()
    proc, out, log_dir = start(setup, name)
    try:
        wait_for(os.path.join(log_dir, "workerlog.0"), r"Epoch 0 done", proc)
        targets = [
            p
            for p in job_processes(out)
            if role_of(p)[0] == victim[0] and (victim[1] is None or role_of(p)[1] == victim[1])
        ]
        assert len(targets) == 1, [role_of(p) for p in job_processes(out)]
        killed_at = time.monotonic()
        targets[0].kill()
        output, _ = proc.communicate(timeout=SURFACE_S + 30)
        surfaced = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
    print(f"\n{name} killed: the launch ended {proc.returncode} after {surfaced:.1f} s")
    assert proc.returncode != 0, output[-3000:]
    assert surfaced < SURFACE_S
    assert re.search(r"heterps launch: FAILED: " + named, output), output[-3000:]
    time.sleep(1)
    assert job_processes(out) == [], "processes of the job outlived it"


def test_a_plan_that_does_not_fit_the_program_fails_the_job(setup):
    bad = setup / "bad_plan.json"
    bad.write_text(
        json.dumps({**PLAN, "stages": [{**PLAN["stages"][0], "layers": ["embedding_0", "fc_9"]}, PLAN["stages"][1]]})
    )
    proc, out, _ = start(setup, "bad-plan", plan=str(bad), epochs=1)
    output, _ = proc.communicate(timeout=SURFACE_S + 30)
    assert proc.returncode != 0
    assert "heterps launch: FAILED:" in output
    assert "not in the program: ['fc_9']" in output, output[-3000:]
    time.sleep(1)
    assert job_processes(out) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM], ids=["SIGKILL", "SIGTERM"])
def test_killing_heterps_launch_itself_stops_the_job(setup, sig):
    # SIGKILL gives heterps launch no chance to stop the job's session: the process that runs Paddle's launcher
    # sees its parent go and stops the job itself.  SIGTERM (and Ctrl-C) is handled by heterps launch: it stops
    # the session and exits 128 + the signal.
    proc, out, log_dir = start(setup, f"launcher-{sig.name}")
    try:
        wait_for(os.path.join(log_dir, "workerlog.0"), r"Epoch 0 done", proc)
        assert len(job_processes(out)) >= 4  # server, 2 CPU trainers, heterogeneous trainer
        proc.send_signal(sig)
        code = proc.wait(timeout=SURFACE_S)
        assert code == (-signal.SIGKILL if sig == signal.SIGKILL else 128 + sig), code
        deadline = time.monotonic() + SURFACE_S
        while job_processes(out) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert job_processes(out) == [], "processes of the job outlived the killed launcher"
    finally:
        for leftover in job_processes(out):
            leftover.kill()


def connect_abort_env(setup, name, retries):
    """The heterogeneous trainer of the job's first attempt ends as Paddle's HeterClient ends a process whose brpc
    connect took longer than its fixed 200 ms (tests/faults/sitecustomize.py)."""
    return {
        "PYTHONPATH": os.pathsep.join(p for p in (FAULTS, os.environ.get("PYTHONPATH")) if p),
        "HETERPS_TEST_CONNECT_ABORT": "HETER_TRAINER",
        "HETERPS_TEST_CONNECT_ABORT_MARKER": str(setup / f"connect_abort_{name}"),
        "HETERPS_CONNECT_RETRIES": str(retries),
    }


def test_paddles_connect_timeout_abort_starts_the_job_again(setup):
    proc, out, log_dir = start(setup, "connect-abort", epochs=2, env=connect_abort_env(setup, "connect-abort", 2))
    try:
        output, _ = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, output[-4000:]
    assert os.path.exists(setup / "connect_abort_connect-abort"), "the fault never fired"
    assert re.search(r"heterps launch: aborted: stage 2 heterogeneous trainer 0 .*killed by SIGABRT", output), output
    assert "Paddle's HeterClient gave up connecting to" in output
    assert "heterps launch: starting the job again (retry 1 of 2, HETERPS_CONNECT_RETRIES)" in output, output
    assert "heterps launch: FAILED" not in output, output[-4000:]
    # The aborted attempt's logs are kept aside; the log directory holds the attempt that finished, as usual.
    kept = os.path.join(log_dir, "aborted-1")
    assert "[E110]Fail to connect" in open(os.path.join(kept, "heterlog.0"), errors="replace").read()
    assert sorted(os.listdir(kept)) == sorted(
        n for n in os.listdir(log_dir) if re.fullmatch(r"(server|worker|heter)log\.\d+|launcher\.log", n)
    )
    assert "[E110]" not in open(os.path.join(log_dir, "heterlog.0"), errors="replace").read()
    assert "Epoch 1 done" in open(os.path.join(log_dir, "workerlog.0"), errors="replace").read()
    # What the script of the finished attempt wrote.
    with open(os.path.join(out, "worker-0.json")) as f:
        assert isinstance(json.load(f)["test_auc"], float)
    time.sleep(1)
    assert job_processes(out) == []
