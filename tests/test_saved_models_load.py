"""Every loader loads what a job saved, whatever shard count its sparse tables were saved in (issue 52, item 1;
runtime/table_shards.py).

A job launched with ``--checkpoint-dir`` saves each sparse table in 24 shard files a server; one without, in
Paddle's 1,000.  Paddle's server loads a table only into the count it was saved with, and says nothing but a warning
otherwise: ``heterps eval`` of the first kind's model scored the dense layers alone (0.7131 against the job's
0.8316), and a job started from its checkpoint with ``init_model_path`` trained from an empty table.  Here, the
README's example trainer (smaller data), each kind saved once, then loaded the way a user loads it:

- ``heterps eval --model model/1`` (a plain Paddle job: the count from ``heterps_tables.json`` beside the save);
- ``-o init_model_path=model/checkpoint -o epochs=0`` with ``--heterps`` (the servers re-cut a table saved in
  another count), 24 into 1,000 and 1,000 into 24;

each scoring the saving job's own held-out AUC, on the same rows.
"""

import json
import os
import re
import subprocess

import pytest
from conftest import heterps_eval

from heterps_paddle.runtime.table_shards import LAYOUT_FILE
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched  # real parameter-server jobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "static_ps_trainer.py")
CONFIG = os.path.join(REPO, "examples", "ctr_dnn", "config.yaml")
OVERRIDES = [
    *("-o", "generate_rows=40000", "-o", "epochs=2", "-o", "batch_size=128", "-o", "print_period=1000"),
    *("-o", "model_config={sparse_feature_dim: 9, fc_sizes: [64, 64], learning_rate: 0.003}"),
]
LAUNCH = ["--server_num=1", "--worker_num=2"]
# The same rows scored by the same model: what differs is the dense values' round trip through the saved text (the
# split job's save, evaluated the same way, came within 1e-4: tests/test_dropin_split.py).
SAME_AUC = 1e-4
RECUT = re.compile(
    r"sparse table (\S+) saved in (\d+) shard files, this job's holds (\d+): re-cut and loaded \((\d+) rows"
)


def _run(tmp, name, extra_launch=(), extra_script=()):
    log_dir, results = str(tmp / f"log_{name}"), str(tmp / f"res_{name}")
    argv = [SCRIPT, "-m", CONFIG, *OVERRIDES, "--heterps", "--result-dir", results, *extra_script]
    job = launch([*LAUNCH, *extra_launch], argv, log_dir, timeout=300)
    assert job.returncode == 0, f"{name}: {job.failures}\n{job.output[-3000:]}"
    with open(os.path.join(results, "worker-0.json")) as f:
        return json.load(f)["test_auc"], job.logs()


def _saved_rows(table):
    """The rows of a saved sparse table (gzip's program: Python's zlib must not share a process with Paddle)."""
    files = sorted(str(table / name) for name in os.listdir(table))
    out = subprocess.run(["gzip", "-dcf", "--", *files], capture_output=True, check=True).stdout
    return sum(1 for line in out.splitlines() if line.strip())


@pytest.fixture(scope="module")
def saved(tmp_path_factory, heterps_cache):
    """Two jobs of the README's trainer: one keeping checkpoints (24 shard files), one not (Paddle's 1,000)."""
    tmp = tmp_path_factory.mktemp("saved-models")
    jobs = {}
    for name, launch_args in (("24", ["--checkpoint-dir", str(tmp / "ckpt")]), ("1000", [])):
        model = tmp / f"model_{name}"
        auc, _ = _run(tmp, f"save_{name}", launch_args, ["-o", f"model_save_path={model}"])
        jobs[name] = {"auc": auc, "model": model}
    return tmp, jobs


def test_each_save_names_its_shard_count_beside_it(saved):
    _, jobs = saved
    for count, job in jobs.items():
        for save in ("1", "checkpoint"):
            document = json.loads((job["model"] / save / LAYOUT_FILE).read_text())
            assert document["shard_num"] == int(count), (save, document)
            assert len(os.listdir(job["model"] / save / "000")) == int(count)
            (table,) = document["tables"].values()
            assert table == {"name": "SparseFeatFactors", "shard_num": int(count)}


def test_heterps_eval_scores_a_model_saved_in_24_shards_as_the_job_did(saved):
    _, jobs = saved
    job = jobs["24"]
    evaluated = heterps_eval(job["model"] / "1", CONFIG, OVERRIDES)
    print(f"\nheterps eval of the 24-shard model {evaluated:.6f}, the job's {job['auc']:.6f}")
    assert abs(evaluated - job["auc"]) <= SAME_AUC


@pytest.mark.parametrize(("saved_in", "into"), [("24", 1000), ("1000", 24)])
def test_a_job_started_from_the_checkpoint_scores_as_the_job_did(saved, saved_in, into):
    tmp, jobs = saved
    job = jobs[saved_in]
    # a job keeping checkpoints holds 24 a server; one without, Paddle's 1,000
    launch_args = ["--checkpoint-dir", str(tmp / f"ckpt_into_{into}")] if into == 24 else []
    start = ["-o", f"init_model_path={job['model'] / 'checkpoint'}", "-o", "epochs=0"]
    auc, logs = _run(tmp, f"init_{saved_in}_into_{into}", launch_args, start)
    print(f"\nstarted from the {saved_in}-shard checkpoint in a job of {into}: {auc:.6f}, the job's {job['auc']:.6f}")
    recut = RECUT.search(logs["serverlog.0"])
    assert recut and recut.group(1, 2, 3) == ("SparseFeatFactors", saved_in, str(into)), logs["serverlog.0"][-3000:]
    assert int(recut.group(4)) == _saved_rows(job["model"] / "checkpoint" / "000")  # every row, on the one server
    assert abs(auc - job["auc"]) <= SAME_AUC
