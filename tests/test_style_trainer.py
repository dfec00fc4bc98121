"""Split plans under an unchanged PaddleRec-style trainer (tests/scripts/paddlerec_style_trainer.py): ``run()`` branches
only on ``is_server()`` / ``is_worker()``, sets ``_fleet_opt['stat_var_names']``, one ``train_from_dataset`` per epoch.

Launched jobs on the same generated data: plain async PS (1 server, 1 CPU trainer), run twice, a 2-stage plan (the
embedding layer on the CPU trainer, the fc layers, loss and AUC on 1 heterogeneous trainer) and a 3-stage plan
(fc_0 on a second heterogeneous stage).  The script prints the AUC it fetches; in a split job the last stage's
heterogeneous trainer prints it (the extension serves the pipeline there, since the script's branches skip it).
Learning is the held-out AUC of the servers' model after training, against plain PS's (the mean of its two runs):
no more than 0.01 below it, and no more than 0.03 above it.  The bounds are not symmetric because the split is not
the same optimisation: its heterogeneous trainer sends every batch's dense gradients and its dense refresh pulls
fresh weights, where plain PS's communicator works with staler ones, and at this job's 2 epochs the split tends to
sit a few thousandths above plain PS (docs/sections.md: seven split runs 0.7761-0.7882, plain 0.7754-0.7829; one CI
run had the 3-stage split 0.0121 above).  Below is what a user must not get; far above (0.03, over twice the largest
excess seen) would mean the split trained on something plain PS did not.  Two CPU trainers under the split are
covered by tests/test_dropin_split.py and tests/test_launch_failures.py.
"""

import json
import os
import re

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import load_plan
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched  # real parameter-server jobs

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "paddlerec_style_trainer.py")
AUC_LINE = re.compile(r"Epoch (\d+) Var auc\[1\]:\[([0-9.]+)\]|auc\[1\]:\[([0-9.]+)\]")
PLANS = {
    "two": [
        {"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 1},
        {"resource": "local_gpu", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
    ],
    "three": [
        {"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 1},
        {"resource": "local_gpu", "kind": "gpu", "layers": ["fc_0"], "units": 1},
        {"resource": "local_cpu", "kind": "cpu", "layers": ["fc_1", "fc_2"], "units": 1},
    ],
}


def last_auc(text):
    values = [float(m.group(2) or m.group(3)) for m in AUC_LINE.finditer(text)]
    return values[-1] if values else None


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("style-trainer")
    data_dir = str(tmp / "data")
    generate(data_dir, 40000, seed=3, test_fraction=0.1)
    out = {}
    for name in ("plain", "plain2", "two", "three"):
        argv = [SCRIPT, "--data", data_dir, "--out", str(tmp / f"out_{name}")]
        launch_args = ["--server_num=1", "--worker_num=1"]
        if not name.startswith("plain"):
            plan = tmp / f"plan_{name}.json"
            plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": PLANS[name]}))
            argv += ["--plan", str(plan)]
            launch_args = launch_arguments(load_plan(str(plan)), 1, gpu_available=False)
        result = launch(launch_args, argv, str(tmp / f"log_{name}"), timeout=300)
        assert result.returncode == 0, f"{name}: {result.failures}\n{result.output[-3000:]}"
        out[name] = result
    return out


def heldout_auc(jobs, name):
    with open(os.path.join(os.path.dirname(jobs[name].log_dir), f"out_{name}", "worker-0.json")) as f:
        return json.load(f)["test_auc"]


def plain_auc(jobs):
    return (heldout_auc(jobs, "plain") + heldout_auc(jobs, "plain2")) / 2


def test_plain_ps_learns(jobs):
    assert plain_auc(jobs) >= 0.75


@pytest.mark.parametrize("name,stages", [("two", 2), ("three", 3)])
def test_split_plan_learns_like_plain_ps(jobs, name, stages):
    logs = jobs[name].logs()
    plain, split = plain_auc(jobs), heldout_auc(jobs, name)
    print(f"\n{name}: held-out AUC {split:.4f} vs plain PS {plain:.4f}")
    assert split >= plain - 0.01, f"the split learns worse than plain PS: {split:.4f} vs {plain:.4f}"
    assert split <= plain + 0.03, f"the split is far above plain PS on the same data: {split:.4f} vs {plain:.4f}"
    # The last stage computes the loss and AUC: its heterogeneous trainer printed the train AUC as it went.
    assert last_auc(logs[f"heterlog.{stages - 2}"]) is not None
    for i in range(stages - 1):
        heter = logs[f"heterlog.{i}"]
        assert "heterogeneous trainer taken over" in heter
        assert "heterogeneous trainer done: stop_worker done; exit 0" in heter
        assert "Run Success" not in heter  # the script's own code after minimize never ran there


@pytest.mark.parametrize("name", ["two", "three"])
def test_cpu_trainers_kept_what_the_script_reads(jobs, name):
    logs = jobs[name].logs()
    worker = logs["workerlog.0"]
    # _fleet_opt['stat_var_names'] was set (no TypeError on None), every epoch ran, the result was written
    assert "Epoch 0 done" in worker and "Epoch 1 done" in worker, worker[-2000:]
    assert "Run Success, Exit." in worker
    assert os.path.isfile(os.path.join(os.path.dirname(jobs[name].log_dir), f"out_{name}", "worker-0.json"))
