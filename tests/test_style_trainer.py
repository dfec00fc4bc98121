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

What the script itself logs, saves and resumes from is judged as a user would (docs/sections.md, "Saves and
metrics"): every job saves its inference model after each epoch and a checkpoint at the end; a serving job written
with Paddle alone (tests/scripts/serve_saved_model.py, which never imports heterps_paddle) loads what a split job
saved and must predict what the servers' model predicted at the save; the saved weights move between epochs as the
one-stage job's do, also when an epoch is one batch (the ``tiny`` job); the epoch AUC PaddleRec's
``get_global_auc`` reads from the scope moves; and a job started from a split job's checkpoint under another
plan starts from its model.
"""

import json
import os
import re
from dataclasses import asdict, replace

import pytest

from heterps_paddle.data.generator import generate, load_meta
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


PLANS["one"] = [{"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0", "fc_0", "fc_1", "fc_2"], "units": 1}]
SERVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "scripts", "serve_saved_model.py")
# A safety net against a hung job, not a bound on its time: beside three suites (load average about 60) a 2-stage
# job of this module took 300 s (2026-11-25), the bound it had.
JOB_TIMEOUT_S = 900
GLOBAL_AUC_LINE = re.compile(r"Epoch (\d+) global auc: ([0-9.]+)")
FIRST_LOSS = re.compile(r"batch: \[1\], Epoch 0 Var loss\[1\]:\[([0-9.]+)\]")


def run_style(tmp, name, data_dir, plan=None, extra=(), save=True):
    argv = [SCRIPT, "--data", data_dir, "--out", str(tmp / f"out_{name}"), *extra]
    if save:
        argv += ["--save-dir", str(tmp / f"save_{name}")]
    launch_args = ["--server_num=1", "--worker_num=1"]
    if plan is not None:
        path = tmp / f"plan_{name}.json"
        path.write_text(json.dumps({"format": 1, "feasible": True, "stages": PLANS[plan]}))
        argv += ["--plan", str(path)]
        launch_args = launch_arguments(load_plan(str(path)), 1, gpu_available=False)
    result = launch(launch_args, argv, str(tmp / f"log_{name}"), timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, f"{name}: {result.failures}\n{result.output[-3000:]}"
    return result


def two_files_of(data_dir, out_dir):
    """A data set of the first two training files of ``data_dir`` (its meta.json names them; the files stay where
    they are) and all its held-out ones."""
    meta = load_meta(data_dir)
    files = list(meta.train_files[:2])
    rows = 0
    for path in files:
        with open(path, "rb") as f:
            rows += sum(1 for _ in f)
    out_dir.mkdir()
    subset = replace(meta, out_dir=str(out_dir), train_files=files, train_rows=rows)
    (out_dir / "meta.json").write_text(json.dumps({"format": 1, **asdict(subset)}))
    return str(out_dir)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, heterps_cache, data_100k):
    tmp = tmp_path_factory.mktemp("style-trainer")
    # 100,000 rows (conftest: data_100k): at 40,000 rows (2 epochs) one 2-stage run under three suites at once (load
    # average near 35) came out 0.0109 under plain PS (0.7694 against 0.7803), where nine earlier split runs spread
    # 0.7761-0.7882 (docs/sections.md): async PS noise that a single run's 0.01 bound missed
    data_dir = data_100k
    out = {"tmp": tmp}
    for name, plan in (("plain", None), ("plain2", None), ("two", "two"), ("three", "three")):
        out[name] = run_style(tmp, name, data_dir, plan, extra=["--print_period", "1"] if name == "plain" else ())
    # The resumed jobs are judged by their first losses and their servers' restore lines, not by what they learn: an
    # epoch of two of the eight files (25,000 rows, 195 batches) is as much of a test as all eight, in less time
    # (22 s and 70 s against 30 s and 98 s here, 2026-11-29; the suite's budget, docs/test-suite.md)
    resume_dir = two_files_of(data_dir, tmp / "two-files")
    # the 2-stage job's checkpoint resumed under a one-stage plan (another dense layout), one epoch
    out["resumed"] = run_style(
        tmp,
        "resumed",
        resume_dir,
        "one",
        extra=["--init-model", str(tmp / "save_two" / "checkpoint"), "--epochs", "1", "--print_period", "1"],
        save=False,
    )
    # ... and under a 3-stage plan (the checkpoint's one dense table regrouped into one per parameter)
    out["resumed3"] = run_style(
        tmp,
        "resumed3",
        resume_dir,
        "three",
        extra=["--init-model", str(tmp / "save_two" / "checkpoint"), "--epochs", "1"],
        save=False,
    )
    # one batch per epoch (80 rows, batch 1000): every save must still be the trained model
    tiny_dir = str(tmp / "tiny")
    generate(tiny_dir, 80, seed=5, test_fraction=0.25)
    out["tiny"] = run_style(tmp, "tiny", tiny_dir, "two", extra=["--batch", "1000", "--epochs", "3"])
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


def saved(jobs, name, epoch, var):
    import numpy as np
    import paddle

    return np.array(paddle.load(str(jobs["tmp"] / f"save_{name}" / str(epoch) / "dnn_plugin" / var)))


def serve(jobs, name, *, checkpoint=False):
    """Predictions of the saved model by a serving job written with Paddle alone, against the servers' model."""
    import numpy as np

    save = jobs["tmp"] / f"save_{name}"
    source = ["--checkpoint", str(save / "checkpoint")] if checkpoint else ["--model", str(save / "1")]
    out = jobs["tmp"] / f"served_{name}_{'checkpoint' if checkpoint else 'model'}"
    argv = [SERVE, *source, "--reference", str(save / "reference.npz"), "--out", str(out)]
    result = launch(["--server_num=1", "--worker_num=1"], argv, str(out) + "_log", timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, f"{result.failures}\n{result.output[-3000:]}"
    served = np.load(out / "predictions.npz")["predict"]
    reference = np.load(save / "reference.npz")["predict"]
    return float(np.abs(served - reference).max())


@pytest.mark.parametrize("name", ["two", "three"])
def test_saved_split_model_predicts_like_the_servers(jobs, name):
    # fleet.save_inference_model on the stage 1 trainer, loaded by fleet.init_server + fleet.load_inference_model
    diff = serve(jobs, name)
    print(f"\n{name}: saved inference model vs the servers' model: max abs difference {diff:.3g}")
    assert diff <= 1e-5


@pytest.mark.parametrize("name", ["two", "three"])
def test_the_flushes_before_saves_read_paddles_queue_sizes(jobs, name):
    # runtime/push_queues.py repeats a flush until the queue sizes Paddle logs for it are 0; a Paddle (or a glog
    # setting) that logged none would leave every save unchecked, which it says once per process.
    logs = jobs[name].logs()
    unchecked = [log for log, text in logs.items() if "logged no queue sizes" in text]
    assert not unchecked, f"{name}: flushes not checked in {unchecked}"
    heter = {log: text for log, text in logs.items() if log.startswith("heterlog")}
    assert heter and all("BrpcPsClient::PrintQueueSize" in text for text in heter.values()), sorted(heter)
    # fix 6: each heterogeneous section queues its dense pushes before it sends its backward message
    moved = [
        int(n)
        for text in heter.values()
        for n in re.findall(r"dense sends moved ahead of the backward message: (\d+)", text)
    ]
    assert len(moved) == len(heter) and all(n > 0 for n in moved), moved


def test_split_checkpoint_loads_in_a_plain_job(jobs):
    # fleet.save_persistables of a split job, in the one-stage layout: fleet.init_server + fleet.load_model
    diff = serve(jobs, "two", checkpoint=True)
    print(f"\ntwo: checkpoint vs the servers' model: max abs difference {diff:.3g}")
    assert diff <= 1e-5


@pytest.mark.parametrize("name", ["plain", "two", "three", "tiny"])
def test_saved_weights_move_every_epoch(jobs, name):
    import numpy as np

    epochs = 3 if name == "tiny" else 2
    for var in ("dnn_0.w_0", "dnn_0.b_0", "dnn_out.w_0", "dnn_out.b_0"):
        values = [saved(jobs, name, epoch, var) for epoch in range(epochs)]
        for before, after in zip(values, values[1:]):
            assert not np.array_equal(before, after), f"{name}: {var} did not change between two epochs' saves"
        if var.endswith(".b_0"):
            assert np.abs(values[-1]).max() > 0, f"{name}: {var} is still all zero (never trained)"


@pytest.mark.parametrize("name", ["plain", "two", "three", "tiny"])
def test_epoch_auc_the_script_logs_moves(jobs, name):
    aucs = [float(v) for _, v in GLOBAL_AUC_LINE.findall(jobs[name].logs()["workerlog.0"])]
    assert len(aucs) == (3 if name == "tiny" else 2), aucs
    assert all(a != 0.5 for a in aucs), f"{name}: an epoch logged AUC 0.5 (no AUC states in the scope): {aucs}"
    assert len(set(aucs)) == len(aucs), f"{name}: the logged AUC does not move: {aucs}"
    if name in ("two", "three"):
        plain = [float(v) for _, v in GLOBAL_AUC_LINE.findall(jobs["plain"].logs()["workerlog.0"])]
        # the same kind of curve as plain PS: within the bound the held-out parity test uses below it
        assert aucs[-1] >= plain[-1] - 0.02, f"{name}: epoch AUCs {aucs} vs plain PS {plain}"


def test_stage1_prints_the_last_stages_loss_and_auc(jobs):
    worker = jobs["two"].logs()["workerlog.0"]
    assert re.search(r"Epoch 1 Var loss\[1\]:\[[0-9.]+\], Epoch 1 Var auc\[1\]:\[[0-9.]+\]", worker), worker[-3000:]


def test_resumed_job_starts_from_the_checkpoint(jobs):
    logs = jobs["resumed"].logs()
    # the 2-stage job wrote its checkpoint in the one-stage layout (its manifest says so); restored as it is
    manifest = json.loads((jobs["tmp"] / "save_two" / "checkpoint" / "heterps_checkpoint.json").read_text())
    assert manifest["layout"] == "one-stage" and len(manifest["dense_tables"]) == 1
    assert "1 dense tables restored (same layout)" in logs["serverlog.0"]
    assert "not overwritten with this trainer's initial values" in logs["workerlog.0"]
    fresh = float(FIRST_LOSS.search(jobs["plain"].logs()["workerlog.0"]).group(1))
    resumed = float(FIRST_LOSS.search(logs["workerlog.0"]).group(1))
    print(f"\nfirst batch loss: fresh model {fresh:.4f}, resumed from the 2-stage checkpoint {resumed:.4f}")
    # a fresh model starts near log(2) = 0.69; the 2-stage job's trained one well below it
    assert resumed < fresh - 0.05


def first_heter_loss(log):
    """The first loss the last stage's heterogeneous trainer printed (after its first 20 batches)."""
    return float(re.search(r"batch: \[\d+\], loss\[1\]:\[([0-9.]+)\]", log).group(1))


def test_checkpoint_resumes_into_a_split_of_other_stages(jobs):
    assert "6 dense tables restored (regrouped from 1 tables)" in jobs["resumed3"].logs()["serverlog.0"]
    fresh = first_heter_loss(jobs["two"].logs()["heterlog.0"])
    resumed = first_heter_loss(jobs["resumed3"].logs()["heterlog.1"])
    print(
        f"\nfirst loss the last stage printed: fresh 2-stage job {fresh:.4f}, 3-stage job resumed from it {resumed:.4f}"
    )
    # (its held-out AUC is no test of the resume: a third epoch over the same rows overfits the embeddings)
    assert resumed < fresh - 0.1
