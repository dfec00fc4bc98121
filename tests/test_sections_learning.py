"""Sections learn: CTR-DNN on generated data, unsplit vs a 2-stage and a 3-stage split, real processes.

Unsplit: plain async PS, 1 server + 1 CPU trainer.  2-stage: embedding layer on the CPU trainer, the fc
layers, loss and AUC on a heterogeneous trainer (also with 2 CPU trainers sharing the data).  3-stage: CPU trainer -> heter trainer (fc_0) -> heter
trainer (fc_1, fc_2 + loss).  Same data, steps, seed.  Held-out AUC (computed on CPU trainer 0 from the
servers' parameters) must agree within 0.01, and the loss curves (printed by the stage that holds the
loss) must overlap.
"""

import json
import os
import re
import sys

import pytest

from heterps_paddle.tools import ctr_job
from heterps_paddle.tools.section_launch import launch

JOB = os.path.abspath(ctr_job.__file__)
# 40k generated rows, 2 epochs of batch 128 (625 steps): enough that repeated unsplit runs agree to
# ~0.002 AUC on this data (with 20k rows x 3 epochs of 64 they spread over 0.01: async PS noise).
ARGS = ["--epochs", "2", "--batch", "128", "--lr", "0.003", "--fc", "64", "64", "--seed", "7",
        "--print_period", "5"]


def _plan(path, stages):
    with open(path, "w") as f:
        json.dump({"format": 1, "feasible": True, "stages": stages}, f)
    return str(path)


@pytest.fixture(scope="module")
def runs(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("sections-learning")
    data = str(tmp / "data")
    ctr_job.gen(data, rows=40000, seed=1)
    plans = {
        "two": _plan(tmp / "plan2.json", [
            {"resource": "cpu_16", "layers": ["embedding_0"], "units": 1},
            {"resource": "gpu_a100", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1}]),
        # the same split with 2 CPU trainers (each reads half of the files) sharing one heter trainer
        "two_2w": _plan(tmp / "plan2w.json", [
            {"resource": "cpu_16", "layers": ["embedding_0"], "units": 2},
            {"resource": "gpu_a100", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1}]),
        "three": _plan(tmp / "plan3.json", [
            {"resource": "cpu_16", "layers": ["embedding_0"], "units": 1},
            {"resource": "gpu_a100", "layers": ["fc_0"], "units": 1},
            {"resource": "cpu_64", "layers": ["fc_1", "fc_2"], "units": 1}]),
    }
    out = {}
    for name in ("base", "two", "two_2w", "three"):
        log_dir = str(tmp / f"log_{name}")
        res = str(tmp / f"res_{name}")
        argv = [JOB, "--data", data, "--out", res] + ARGS
        if name == "base":
            r = launch(None, argv, log_dir, timeout=240, launch_args=["--server_num=1", "--worker_num=1"])
        else:
            r = launch(plans[name], argv + ["--plan", plans[name], "--microbatches", "4"], log_dir, timeout=240)
        assert r["returncode"] == 0, f"{name}: {r['errors']}"
        with open(res + ".trainer0") as f:
            result = json.load(f)
        out[name] = {"result": result, "log_dir": log_dir, "launch": r}
    return out


def _loss_curve(log_dir):
    """Losses printed by train_from_dataset's fetch (by the process that holds the loss)."""
    losses = []
    for name in sorted(os.listdir(log_dir)):
        if not name.startswith(("workerlog", "heterlog")):
            continue
        with open(os.path.join(log_dir, name), errors="replace") as f:
            found = [float(m.group(1)) for m in re.finditer(r"loss\[1\]:\[([0-9.]+)\]", f.read())]
        if found:
            losses = found
    return losses


def _chunks(xs, n=5):
    """(mean, variance of the mean) of n consecutive chunks of a curve."""
    size = len(xs) // n
    out = []
    for i in range(n):
        part = xs[i * size:(i + 1) * size]
        mean = sum(part) / size
        var = sum((x - mean) ** 2 for x in part) / (size - 1)
        out.append((mean, var / size))
    return out


def test_unsplit_reference_learns(runs):
    base = runs["base"]["result"]
    print(f"unsplit held-out AUC {base['heldout_auc']:.4f} (best possible {base['bayes_test_auc']:.4f})",
          file=sys.stderr)
    assert base["heldout_auc"] > 0.65  # a constant predictor gets 0.5


@pytest.mark.parametrize("name", ["two", "two_2w", "three"])
def test_sections_match_unsplit_auc(runs, name):
    base, split = runs["base"]["result"], runs[name]["result"]
    print(f"{name}-stage held-out AUC {split['heldout_auc']:.4f} vs unsplit {base['heldout_auc']:.4f}",
          file=sys.stderr)
    assert abs(split["heldout_auc"] - base["heldout_auc"]) <= 0.01


@pytest.mark.parametrize("name", ["two", "three"])
def test_loss_curves_overlap(runs, name):
    base, split = _loss_curve(runs["base"]["log_dir"]), _loss_curve(runs[name]["log_dir"])
    # Same number of steps: one print every 5 batches of 128 (micro-batches count as batches).
    assert len(base) >= 100 and abs(len(split) - len(base)) <= 2, (len(base), len(split))
    b, s = _chunks(base), _chunks(split)
    assert b[0][0] - b[-1][0] > 0.05 and s[0][0] - s[-1][0] > 0.05, (b, s)  # both go down
    # Each printed loss is one batch's: compare chunk means against their own noise (z < 3.5 for each of
    # the 5 chunks), and in absolute terms.
    for (mb, vb), (ms, vs) in zip(b, s):
        assert abs(mb - ms) < 0.05 and abs(mb - ms) / (vb + vs) ** 0.5 < 3.5, (b, s)


@pytest.mark.parametrize("name", ["base", "two", "two_2w", "three"])
def test_sparse_gradients_reach_the_servers(runs, name):
    # Embedding rows start within +-0.05; after training a good share of the looked-up values on the
    # servers left that range, which only sparse pushes can do.
    assert runs[name]["result"]["sparse_rows_moved"] > 0.15


@pytest.mark.parametrize("name,stage_tables", [
    ("two", {2: {"dnn_0", "dnn_1", "dnn_out"}}),
    ("two_2w", {2: {"dnn_0", "dnn_1", "dnn_out"}}),
    ("three", {2: {"dnn_0"}, 3: {"dnn_1", "dnn_out"}}),
])
def test_every_stage_refreshes_its_dense_parameters(runs, name, stage_tables):
    log_dir = runs[name]["log_dir"]
    seen = {}
    for fname in os.listdir(log_dir):
        if not fname.startswith("heterlog"):
            continue
        text = open(os.path.join(log_dir, fname), errors="replace").read()
        stage = int(re.search(r"heterps: section of stage (\d+)", text).group(1))
        m = re.search(r"heterps: dense refresh every \d+ ms for tables (\{.*\})", text)
        assert m, f"{fname}: stage {stage} never pulled its dense parameters"
        seen[stage] = {v.split(".")[0] for names in re.findall(r"\[([^\]]*)\]", m.group(1))
                       for v in re.findall(r"'([^']+)'", names)}
        # and the section sends those parameters' gradients
        sends = re.search(r"dense_sends=\[([^\]]*)\]", text).group(1)
        assert all(p in sends for p in seen[stage])
    assert seen == stage_tables


def test_stage_one_pushes_sparse_gradients(runs):
    for name in ("two", "two_2w", "three"):
        text = open(os.path.join(runs[name]["log_dir"], "workerlog.0"), errors="replace").read()
        m = re.search(r"heterps: section of stage 1: .* sparse_pushes=(\d+) \(slots (.*?)\) ", text)
        assert m and int(m.group(1)) == 1, name
        assert "[]" not in m.group(2)  # slots restored (an empty list aborts the push)
