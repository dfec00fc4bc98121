"""Checkpoints the launch owns (docs/checkpoints.md): ``heterps launch --checkpoint-dir DIR --checkpoint-every 1``
under the unchanged PaddleRec-style trainer (tests/scripts/paddlerec_style_trainer.py), real jobs, real files.

Three launches over one directory:

1. a 2-stage split job, 3 epochs: a checkpoint after every pass, the last two kept, each complete (its manifest
   verifies, says the passes done, holds the plan);
2. the same launch with the trainer's epochs set to 4: it resumes from pass-000003, skips 3 passes and trains the
   fourth; the model its servers hold right after the restore (the script's own save after its first, skipped,
   epoch) is the checkpoint's, row for row and value for value, sparse and dense;
3. pass-000004 corrupted, a pass-000005 left without a manifest (a save killed before it finished) and a staging
   directory of a save killed midway: the launch names both refused ones and resumes from pass-000003, under a
   one-stage plan this time (so a one-stage job's checkpoint is written too, pass-000004 again).
"""

import gzip
import json
import os
import re
import shutil

import numpy as np
import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import load_plan
from heterps_paddle.runtime.checkpoint_files import MANIFEST, verify
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched  # real parameter-server jobs

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "paddlerec_style_trainer.py")
PLANS = {
    "two": [
        {"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 1},
        {"resource": "local_gpu", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
    ],
    "one": [{"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"], "units": 1}],
}


def run(tmp, name, plan, epochs, checkpoints, save=False, env=None, fails=False):
    path = tmp / f"plan_{name}.json"
    path.write_text(json.dumps({"format": 1, "feasible": True, "stages": PLANS[plan]}))
    argv = [SCRIPT, "--data", str(tmp / "data"), "--out", str(tmp / f"out_{name}"), "--plan", str(path)]
    argv += ["--epochs", str(epochs)]
    if save:
        argv += ["--save-dir", str(tmp / f"save_{name}")]
    own = ["--checkpoint-dir", str(checkpoints), "--checkpoint-every", "1"]
    boards = os.path.join(os.environ["HETERPS_CACHE"], "launches")
    before = set(os.listdir(boards)) if os.path.isdir(boards) else set()
    result = launch(
        own + launch_arguments(load_plan(str(path)), 1, gpu_available=False),
        argv,
        str(tmp / f"log_{name}"),
        300,
        env=None if env is None else {**os.environ, **env},
    )
    if fails:
        assert result.returncode != 0, f"{name}: ended 0\n{result.output[-3000:]}"
        return result
    assert result.returncode == 0, f"{name}: {result.failures}\n{result.output[-3000:]}"
    # the launch's board (the side channels' endpoints, the servers' restore markers) went with the job
    assert (set(os.listdir(boards)) if os.path.isdir(boards) else set()) <= before
    return result


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("launch-checkpoints")
    generate(str(tmp / "data"), 3000, seed=3, test_fraction=0.1)
    checkpoints = tmp / "checkpoints"
    out = {"tmp": tmp, "dir": checkpoints}
    out["first"] = run(tmp, "first", "two", 3, checkpoints)
    out["after_first"] = sorted(os.listdir(checkpoints))
    # checked now: every file there with its checksum (the later launches change the directory)
    out["manifests"] = {p: verify(str(checkpoints / f"pass-00000{p}")) for p in (2, 3)}
    # kept aside: the resumed launch writes pass-000004 and removes pass-000002
    shutil.copytree(checkpoints / "pass-000003", tmp / "pass-000003.copy")
    out["resumed"] = run(tmp, "resumed", "two", 4, checkpoints, save=True)
    out["after_resumed"] = sorted(os.listdir(checkpoints))
    newest = checkpoints / "pass-000004"
    part = sorted((newest / "001").iterdir())[0]
    part.write_bytes(part.read_bytes()[:-8] + b"corrupt!")
    shutil.copytree(newest, checkpoints / "pass-000005", ignore=shutil.ignore_patterns(MANIFEST))
    shutil.copytree(checkpoints / "pass-000003", checkpoints / ".pass-000006.incomplete")
    out["refusing"] = run(tmp, "refusing", "one", 4, checkpoints)
    # the servers changed after the checkpoint's files verified and loaded (tests/faults/sitecustomize.py)
    faults = os.path.join(os.path.dirname(os.path.abspath(__file__)), "faults")
    changed = {
        "PYTHONPATH": os.pathsep.join(filter(None, [faults, os.environ.get("PYTHONPATH")])),
        "HETERPS_TEST_CHANGE_RESTORED": "dnn_1.w_0",
    }
    out["changed"] = run(tmp, "changed", "one", 5, checkpoints, env=changed, fails=True)
    return out


def test_a_checkpoint_after_every_pass_the_last_two_kept(jobs):
    assert [n for n in jobs["after_first"] if not n.startswith(".")] == ["pass-000002", "pass-000003"]
    for passes, manifest in jobs["manifests"].items():
        assert manifest["launch"]["passes_done"] == passes
        assert manifest["layout"] == "one-stage"  # the split job's dense tables regrouped, as fleet's save does
        assert "plan.json" in manifest["files"] and manifest["launch"]["plan_digest"]
        assert any(f.startswith("000/") for f in manifest["files"])  # the sparse table
    worker = jobs["first"].logs()["workerlog.0"]
    assert "pass-000003: complete (3 passes done" in worker
    # two phases (docs/checkpoints.md, "The pause"): the trainers trained again once the servers had written the
    # tables to memory (one host: every server is here); the rest was done in the background and timed apart
    for passes, manifest in jobs["manifests"].items():
        assert f"checkpoint after pass {passes}: captured in " in worker
        launch = manifest["launch"]
        assert 0 < launch["pause_s"] <= launch["save_s"] and launch["persist_s"] > 0, launch
        assert set(launch["steps_s"]) == {"contents_s", "regroup_s", "compress_s", "hash_s", "manifest_s", "copy_s"}, (
            launch
        )
    assert "/dev/shm/heterps-staging-" in worker and "staged on disk" not in worker
    assert "pass-000001: removed" in worker
    assert "no checkpoint there yet: starting fresh" in jobs["first"].output


def test_relaunch_resumes_and_skips_the_passes_done(jobs):
    result = jobs["resumed"]
    assert "resuming from checkpoint" in result.output and "pass-000003 (3 passes done)" in result.output
    logs = result.logs()
    worker = logs["workerlog.0"]
    for skipped in (1, 2, 3):
        assert f"checkpoint: pass {skipped} skipped" in worker
    assert "checkpoint: pass 4 skipped" not in worker
    assert "not overwritten with this trainer's initial values" in worker
    assert "init_server: resuming from the launch's checkpoint" in logs["serverlog.0"]
    assert "6 dense tables restored (regrouped from 1 tables)" in logs["serverlog.0"]  # one per parameter
    # the script's loop went on at the next epoch: four epochs logged, the fourth trained (its batches printed)
    assert "Epoch 3 done" in worker
    assert jobs["after_resumed"] == [".sync", "pass-000003", "pass-000004"]
    assert verify(str(jobs["dir"] / "pass-000003"))  # still complete


def _lines(directory):
    lines = []
    for name in sorted(os.listdir(directory)):
        path = os.path.join(directory, name)
        with gzip.open(path, "rt") if name.endswith(".gz") else open(path) as f:
            lines += [line.rstrip("\n") for line in f if line.strip()]
    return lines


def test_restored_tables_equal_the_checkpoint_bit_for_bit(jobs):
    import paddle

    checkpoint = jobs["tmp"] / "pass-000003.copy"
    restored = jobs["tmp"] / "save_resumed" / "0"  # the script's save after its first epoch, which was skipped
    # sparse: every row of the servers' table, optimizer slots included (Paddle's text lines, in any order)
    ours, theirs = sorted(_lines(restored / "000")), sorted(_lines(checkpoint / "000"))
    assert len(theirs) > 100 and ours == theirs
    # dense: each parameter's values pulled from the servers against the checkpoint's lines (first column)
    manifest = json.loads((checkpoint / MANIFEST).read_text())
    compared = 0
    for table in manifest["dense_tables"]:
        lines = _lines(checkpoint / f"{table['table_id']:03d}")
        start = 0
        for name, numel in zip(table["names"], table["numels"]):
            pulled = np.array(paddle.load(str(restored / "dnn_plugin" / name))).reshape(-1)
            saved = np.array([float(line.split()[0]) for line in lines[start : start + numel]], dtype=np.float32)
            start += numel
            np.testing.assert_array_equal(pulled, saved, err_msg=name)
            compared += 1
    assert compared >= 6  # three fc layers' weights and biases


def test_corrupt_and_incomplete_checkpoints_are_refused_by_name(jobs):
    result = jobs["refusing"]
    output = result.output
    assert "checkpoint REFUSED: checkpoint" in output
    assert "pass-000005: incomplete (no heterps_checkpoint.json" in output
    assert "pass-000004: 001/part-" in output and "does not match its checksum (corrupted)" in output
    assert "pass-000003 (3 passes done)" in output
    worker = result.logs()["workerlog.0"]
    assert "checkpoint: pass 3 skipped" in worker and "checkpoint: pass 4 skipped" not in worker
    # the one-stage job wrote pass-000004 anew over the corrupt one; the staging leftovers went
    assert verify(str(jobs["dir"] / "pass-000004"))["launch"]["passes_done"] == 4
    assert "an earlier launch's checkpoint after pass 4 replaced" in worker
    assert not (jobs["dir"] / ".pass-000006.incomplete").exists()


def test_every_resume_proves_what_its_servers_hold(jobs):
    """Issue 52, item 3: before a batch trains, trainer 0 compares what the servers hold after the restore with the
    figures the checkpoint recorded at capture, in the new plan's layout (split into split, split into one stage);
    the other trainers wait for its word."""
    for name, layout in (("resumed", "split"), ("refusing", "one-stage")):
        worker = jobs[name].logs()["workerlog.0"]
        assert "pass-000003: restore proven, the servers hold what it captured: 6 dense parameters" in worker, layout
        assert re.search(r"sparse table 000 \(\d+ rows, every row\)", worker), layout
    contents = jobs["manifests"][3]["contents"]
    assert set(contents["dense"]) == {"dnn_0.b_0", "dnn_0.w_0", "dnn_1.b_0", "dnn_1.w_0", "dnn_out.b_0", "dnn_out.w_0"}
    assert contents["format"] == 2 and contents["sparse"]["000"]["rows"] > 100
    assert re.fullmatch(r"[0-9a-f]{32}", contents["sparse"]["000"]["digest"]), contents["sparse"]


def test_a_restore_that_changed_what_was_captured_is_refused_by_name(jobs):
    """The servers' dense parameter changed after the checkpoint's files verified and loaded: only the check of
    what they hold sees it, and the launch ends non-zero before a batch trains, naming the parameter, the
    checkpoint and both digests."""
    result = jobs["changed"]
    logs = result.logs()
    assert "dnn_1.w_0's first value changed on the servers after the restore" in logs["serverlog.0"]
    worker = logs["workerlog.0"]
    message = re.search(r"the restore from checkpoint (\S+) does not reproduce what it captured: (.*)", worker)
    assert message, worker[-3000:]
    assert message.group(1).endswith("pass-000004")
    assert re.match(
        r"dense parameter dnn_1.w_0's values digest: the servers hold [0-9a-f]{32}, the checkpoint "
        r"captured [0-9a-f]{32}",
        message.group(2),
    ), message.group(2)
    assert "FAILED" in result.output and "workerlog.0" in result.output
    assert "Epoch 4 done" not in worker and not re.search(r"batch: \[\d+\]", worker)  # no batch trained
