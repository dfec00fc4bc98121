"""Planning inside the job leaves the job's own Paddle state alone (docs/automatic-path.md).

A first launch with ``{"cluster": "local"}`` measures the program inside ``minimize``, in the trainer's process.
Paddle 2.6.2's dataset trainers share one process-wide thread pool sized by the first trainer a process builds, so
the one-thread calibration pass the profile used to run there made the script's own ``train_from_dataset`` over 8
files with more threads abort (``dist_multi_trainer.cc:115] Check failed: ... pool.size() == thread_num_ (1 vs.
8)``, 3 of 4 such launches of PaddleRec's trainer).  These jobs are that launch: the unchanged PaddleRec-style
trainer reading a directory of 8 files with 4 threads, a first launch (nothing cached for this program) with a
QueueDataset, and ``replan: true`` with an InMemoryDataset.  Both must train to the end like plain Paddle.
"""

import json
import os

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "paddlerec_style_trainer.py")


@pytest.mark.parametrize(
    "name,extra",
    [("queue-first-launch", []), ("in-memory-replan", ["--in-memory", "--replan"])],
)
def test_first_launch_trains_like_plain_paddle(tmp_path_factory, heterps_cache, name, extra):
    tmp = tmp_path_factory.mktemp(name)
    data_dir = str(tmp / "data")
    meta = generate(data_dir, 8000, seed=11, test_fraction=0.1)
    assert len(meta.train_files) >= 8
    out = tmp / "out"
    # fc sizes no other test uses: nothing is cached for this program, so the profile is measured in this launch
    argv = [SCRIPT, "--data", data_dir, "--out", str(out), "--output-dir", str(out), "--cluster", "local"]
    argv += ["--threads", "4", "--fc", "24", "24"]
    result = launch(["--server_num=1", "--worker_num=1"], argv + extra, str(tmp / "log"), timeout=400)
    logs = result.logs()
    worker = logs.get("workerlog.0", "")
    assert result.returncode == 0, f"{result.failures}\n{worker[-3000:]}"
    assert "Check failed" not in worker
    assert "profile measured in this process" in worker, "the profile was not measured in this launch"
    with open(out / "worker-0.json") as f:
        assert json.load(f)["test_auc"] > 0.5
