"""A full disk under the launch's checkpoints (docs/checkpoints.md): the save that does not fit fails the job loudly,
naming the checkpoint and the disk, the previous checkpoint is kept whole, and once there is room a relaunch resumes
from it and finishes.  The checkpoint directory is a small tmpfs this test mounts (root only) and removes."""

import json
import os
import subprocess

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import load_plan
from heterps_paddle.runtime.checkpoint_files import verify
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "paddlerec_style_trainer.py")
ONE_STAGE = [{"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"], "units": 1}]


@pytest.fixture
def small_disk(tmp_path):
    """A tmpfs, sized by the test (root only)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(mount)], capture_output=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (root only): {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def run(tmp, name, checkpoints):
    plan = tmp / "plan.json"
    plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": ONE_STAGE}))
    argv = [SCRIPT, "--data", str(tmp / "data"), "--out", str(tmp / f"out_{name}"), "--plan", str(plan)]
    own = ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1"]
    arguments = launch_arguments(load_plan(str(plan)), 1, gpu_available=False)
    return launch(own + arguments, argv + ["--epochs", "3"], str(tmp / f"log_{name}"), 300)


def disk_kib(path):
    """What ``path`` takes on its disk (blocks, not bytes: a file takes a whole page on a tmpfs)."""
    return int(subprocess.run(["du", "-sk", str(path)], capture_output=True, text=True, check=True).stdout.split()[0])


def test_a_full_disk_fails_the_save_loudly_and_keeps_the_checkpoint_before(tmp_path, small_disk, heterps_cache):
    generate(str(tmp_path / "data"), 3000, seed=3, test_fraction=0.1)
    # the disk holds two checkpoints of this job and half a third, measured on the same job first (the last two are
    # kept; each pass trains the same rows, so the three are alike).  Their size follows the table's layout: 1,000
    # small shard files took 5 MiB a checkpoint, 24 far less.
    measured = run(tmp_path, "measured", small_disk / "measured")
    assert measured.returncode == 0, measured.output[-4000:]
    sizes = [disk_kib(small_disk / "measured" / f"pass-00000{n}") for n in (2, 3)]
    subprocess.run(["rm", "-rf", str(small_disk / "measured")], check=True)
    room = 2 * max(sizes) + min(sizes) // 2
    subprocess.run(["mount", "-o", f"remount,size={room}k", str(small_disk)], check=True)
    checkpoints = small_disk / "checkpoints"
    full = run(tmp_path, "full", checkpoints)
    assert full.returncode != 0
    text = full.output
    assert "checkpoint after pass 3 FAILED" in text, text[-4000:]
    assert "pass-000002 is kept" in text and ("No space left on device" in text or "is full" in text), text[-4000:]
    assert sorted(n for n in os.listdir(checkpoints) if n.startswith("pass-")) == ["pass-000001", "pass-000002"]
    verify(str(checkpoints / "pass-000002"))  # whole: every file as its manifest says

    # room again: the relaunch resumes from pass 2, trains pass 3 and saves it
    subprocess.run(["mount", "-o", "remount,size=64m", str(small_disk)], check=True)
    again = run(tmp_path, "again", checkpoints)
    assert again.returncode == 0, again.output[-4000:]
    assert "resuming from checkpoint" in again.output and "pass-000002 (2 passes done)" in again.output
    assert verify(str(checkpoints / "pass-000003"))
