"""A checkpoint's background phase killed (docs/checkpoints.md, "The pause"): CPU trainer 0 is SIGKILLed while it
persists checkpoint 2 (staged in memory; tests/faults/sitecustomize.py holds it there), training having gone on.
The launch fails loudly, checkpoint 1 stays the newest complete one, the memory staging area is freed, and a
relaunch resumes from checkpoint 1 and finishes with a complete checkpoint of every pass."""

import json
import os
import signal
import threading
import time

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import load_plan
from heterps_paddle.runtime.checkpoint_files import verify
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched

TESTS = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(TESTS, "scripts", "paddlerec_style_trainer.py")
ONE_STAGE = [{"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"], "units": 1}]


def run(tmp, name, checkpoints, env=None):
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": ONE_STAGE}))
    argv = [SCRIPT, "--data", str(tmp / "data"), "--out", str(tmp / f"out_{name}"), "--plan", str(plan)]
    own = ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1"]
    arguments = launch_arguments(load_plan(str(plan)), 1, gpu_available=False)
    return launch(own + arguments, argv + ["--epochs", "3"], str(tmp / f"log_{name}"), 300, env=env)


def kill_when_held(marker, said, stop):
    """SIGKILL to the process that holds the checkpoint, once it says so (its pid and staging directory)."""
    while not stop.is_set():
        if marker.exists():
            pid, staging = marker.read_text().split(" ", 1)
            said.update(pid=int(pid), staging=staging, existed=os.path.isdir(staging))
            os.kill(int(pid), signal.SIGKILL)
            return
        time.sleep(0.1)


def test_the_persisting_trainer_killed_leaves_the_checkpoint_before_and_no_staging(tmp_path, heterps_cache):
    generate(str(tmp_path / "data"), 3000, seed=3, test_fraction=0.1)
    checkpoints = tmp_path / "checkpoints"
    marker = tmp_path / "held"
    env = dict(os.environ)
    env.update(
        PYTHONPATH=os.pathsep.join(filter(None, [os.path.join(TESTS, "faults"), env.get("PYTHONPATH")])),
        HETERPS_TEST_HOLD_CHECKPOINT_PASS="2",
        HETERPS_TEST_HOLD_MARKER=str(marker),
    )
    said, stop = {}, threading.Event()
    killer = threading.Thread(target=kill_when_held, args=(marker, said, stop), daemon=True)
    killer.start()
    try:
        killed = run(tmp_path, "killed", checkpoints, env)
    finally:
        stop.set()
        killer.join(10)
    assert said, "checkpoint 2 was never held"
    assert killed.returncode != 0
    assert "was killed by SIGKILL" in killed.output and "CPU trainer 0" in killed.output, killed.output[-3000:]
    # held in the background: checkpoint 2 was in memory, the trainers training pass 3 meanwhile
    assert said["staging"].startswith("/dev/shm/heterps-staging-") and said["existed"], said
    assert "checkpoint after pass 2: captured in " in killed.logs()["workerlog.0"]
    # nothing half-written is taken for a checkpoint, and the memory it held is given back (the launch swept it)
    assert sorted(n for n in os.listdir(checkpoints) if n.startswith("pass-")) == ["pass-000001"]
    verify(str(checkpoints / "pass-000001"))
    assert not os.path.exists(os.path.dirname(said["staging"]))

    again = run(tmp_path, "again", checkpoints)
    assert again.returncode == 0, again.output[-4000:]
    assert "resuming from checkpoint" in again.output and "pass-000001 (1 passes done)" in again.output
    assert "pass 1 skipped (train_from_dataset not run)" in again.logs()["workerlog.0"]
    for passes in (2, 3):
        assert verify(str(checkpoints / f"pass-00000{passes}"))["launch"]["passes_done"] == passes
