"""PaddleRec's CTR models, unchanged, on one stage and on a split (issue 65).

DNN, Wide&Deep, DeepFM and DLRM (their ``net.py`` / ``static_model.py`` as PaddleRec ships them:
tests/data/paddlerec_models/), each trained by a PaddleRec-style trainer (tests/scripts/paddlerec_rank_trainer.py:
the import and ``strategy.heterps = True``) with its own small config, twice on the same generated data:

- one stage: a saved one-stage plan on 2 CPU trainers;
- a forced split: a saved plan whose stage 1 (1 CPU trainer) holds every layer up to the model's last sparse one and
  whose stage 2 (1 heterogeneous trainer) the rest: the loss and every AUC op run there (DNN and Wide&Deep build
  ``paddle.static.auc(num_thresholds=2**12, slide_steps=20)``, DeepFM and DLRM ``slide_steps=0``, whose state
  changes shape after its first batch: DLRM's split crashed in the stage metrics on it).

Each job saves its inference model after every epoch (``fleet.save_inference_model``); the last one is loaded by
Paddle's own loaders in a fresh plain Paddle job (tests/scripts/paddlerec_rank_eval.py: ``fleet.init_server`` and
``fleet.load_inference_model``, no heterps_paddle) and scores the held-out rows.  The split must score no worse
than ``SAME_AUC`` under the same model's one-stage run (it came out above it: see SAME_AUC), and the one-stage run
must have learned.
"""

import json
import os
import re
import subprocess
import sys

import pytest

from heterps_paddle.data.generator import generate
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import load_plan
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched  # real parameter-server jobs

TESTS = os.path.dirname(os.path.abspath(__file__))
MODELS_DIR = os.path.join(TESTS, "data", "paddlerec_models")
TRAINER = os.path.join(TESTS, "scripts", "paddlerec_rank_trainer.py")
EVALUATOR = os.path.join(TESTS, "scripts", "paddlerec_rank_eval.py")
MODELS = ("dnn", "wide_deep", "deepfm", "dlrm")
ROWS = 40_000  # 2 epochs of batch 128 (the configs'): at 20,000 rows DNN scored 0.641 on one stage, 0.696 split
EPOCHS = 2
# The split against one stage, on the same held-out rows: no worse by more than SAME_AUC.  It is not the same
# optimisation (its heterogeneous trainer sends every batch's dense gradients and pulls fresh weights, where the
# one-stage job's two trainers work through the async communicator with staler ones) and in 2 epochs it came out
# above, by 0.03-0.06 for DNN and Wide&Deep (0.7539 vs 0.7233, 0.7547 vs 0.7099, 0.7561 vs 0.6950; 0.7300 vs 0.7030,
# 0.7273 vs 0.6860, 0.7318 vs 0.7044), by about 0 for DeepFM (docs/models.md): so no bound from above.
SAME_AUC = 0.02
LEARNED = 0.55  # a constant predictor scores 0.5


def config(model):
    return os.path.join(MODELS_DIR, model, "config_cpups.yaml")


def layers(model):
    """The model's layers as the planner groups them (the names a plan's stages list)."""
    done = subprocess.run(
        [sys.executable, TRAINER, "-m", config(model), "--print-layers"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=os.path.dirname(TRAINER),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def plans(model_layers):
    """(one stage on 2 CPU trainers, the split after the last sparse layer on 1 CPU + 1 heterogeneous trainer)."""
    names = [layer["name"] for layer in model_layers]
    cut = max(i for i, layer in enumerate(model_layers) if layer["kind"] == "sparse") + 1
    one = [{"resource": "local_cpu", "kind": "cpu", "layers": names, "units": 2}]
    split = [
        {"resource": "local_cpu", "kind": "cpu", "layers": names[:cut], "units": 1},
        {"resource": "local_gpu", "kind": "gpu", "layers": names[cut:], "units": 1},
    ]
    return {"one": one, "split": split}


# Paddle 2.6.2's parameter server died once in three DeepFM splits here, in its dense Adam's first MKL call
# (DAdam::Update -> vsSqr -> mkl_serv_getenv: SIGSEGV, on the server's table threads): that launch is tried once more,
# and the retry is said in the test's output and results.
PADDLE_MKL_CRASH = "mkl_serv_getenv"


def run(tmp, model, name, stages, data):
    """Train on ``stages`` (a saved plan), then score the last saved model in a plain Paddle job."""
    out = attempt(tmp / f"{model}_{name}", model, stages, data)
    if out["returncode"] != 0 and PADDLE_MKL_CRASH in out["logs"].get("serverlog.0", ""):
        print(f"\n{model} {name}: the parameter server died in Paddle's MKL call ({PADDLE_MKL_CRASH}); once more")
        out = {**attempt(tmp / f"{model}_{name}_again", model, stages, data), "retried": PADDLE_MKL_CRASH}
    return out


def attempt(work, model, stages, data):
    work.mkdir()
    plan = work / "plan.json"
    plan.write_text(json.dumps({"format": 1, "feasible": True, "stages": stages}))
    argv = [TRAINER, "-m", config(model), "--data", data, "--out", str(work / "out"), "--plan", str(plan)]
    argv += ["--save-dir", str(work / "model"), "--epochs", str(EPOCHS)]
    trained = launch(launch_arguments(load_plan(str(plan)), 1, gpu_available=False), argv, str(work / "log"), 600)
    out = {"returncode": trained.returncode, "failures": trained.failures, "seconds": trained.seconds}
    out["logs"] = {n: (work / "log" / n).read_text(errors="replace") for n in os.listdir(work / "log")}
    written = os.listdir(work / "out") if (work / "out").is_dir() else []
    results = sorted(f for f in written if re.fullmatch(r"worker-\d+\.json", f))
    out["results"] = [json.loads((work / "out" / f).read_text()) for f in results]
    if trained.returncode != 0:
        return out
    scored = launch(
        ["--server_num=1", "--worker_num=1"],
        [EVALUATOR, "-m", config(model), "--model", str(work / "model" / str(EPOCHS - 1)), "--data", data]
        + ["--out", str(work / "eval")],
        str(work / "eval_log"),
        600,
    )
    out["eval_returncode"], out["eval_failures"] = scored.returncode, scored.failures
    if scored.returncode == 0:
        out["test_auc"] = json.loads((work / "eval" / "eval.json").read_text())["test_auc"]
    return out


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("paddlerec-models")
    data = str(tmp / "data")
    generate(data, ROWS, seed=5)
    out = {}
    for model in MODELS:
        model_layers = layers(model)
        out[model] = {"layers": model_layers}
        for name, stages in plans(model_layers).items():
            out[model][name] = run(tmp, model, name, stages, data)
    print("\n" + "\n".join(summary(model, out[model]) for model in MODELS))
    return out


def summary(model, runs):
    parts = [
        f"{name} {runs[name].get('test_auc', float('nan')):.4f} ({runs[name]['seconds']:.0f} s)"
        for name in ("one", "split")
    ]
    return f"{model}: held-out AUC " + " | ".join(parts)


@pytest.mark.parametrize("model", MODELS)
def test_every_launch_ends_0_and_every_pass_runs(jobs, model):
    for name, trainers in (("one", 2), ("split", 1)):
        job = jobs[model][name]
        assert job["returncode"] == 0, f"{model} {name}: {job['failures']}"
        assert job["eval_returncode"] == 0, f"{model} {name} evaluation: {job['eval_failures']}"
        for index in range(trainers):
            log = job["logs"][f"workerlog.{index}"]
            assert re.findall(r"Epoch (\d+) done", log) == [str(e) for e in range(EPOCHS)], (model, name, index)
            assert "Run Success, Exit." in log
        assert [r["epochs"] for r in job["results"]] == [EPOCHS] * trainers


@pytest.mark.parametrize("model", MODELS)
def test_the_split_runs_two_stages_with_the_metrics_of_every_auc_op(jobs, model):
    split = jobs[model]["split"]
    worker = split["logs"]["workerlog.0"]
    assert "heterps: plan has 2 stages" in worker
    assert "heterps: heterogeneous trainer taken over (stage 2)" in split["logs"]["heterlog.0"]
    assert "stage metrics (runtime/stage_metrics.py) failed" not in worker
    assert "Traceback" not in worker
    # the last stage's fetched loss and AUC, printed on the CPU trainer in Paddle's format
    assert re.search(rf"Epoch {EPOCHS - 1} Var auc\[1\]:\[0\.\d+\]", worker), worker[-3000:]


@pytest.mark.parametrize("model", MODELS)
def test_the_one_stage_job_learned(jobs, model):
    assert jobs[model]["one"]["test_auc"] > LEARNED, summary(model, jobs[model])


# DLRM's top MLP has batch norms on the heterogeneous stage: their moving mean and variance are no parameters, so
# the servers never have them; a split's save takes them from the stage's heterogeneous trainer (runtime/saves.py,
# later_stages_statistics; before, it wrote their startup values and the saved split scored 0.5730 against one
# stage's 0.6325).  With them the split scored 0.5979 against 0.5821.  Its learning rate is now 0.01 (its config):
# at 40,000 rows one stage scored 0.701-0.727 in four runs and the split 0.701 and 0.715, but at 100,000 rows one of
# two one-stage runs saved models that score 0.621 (epoch 0) and 0.567 (epoch 1) while both its trainers logged
# training AUCs like the other run's (0.69-0.70; that run's saved model 0.743, the splits' 0.784 and 0.731).  Scored
# with each held-out batch's own statistics those saves score 0.786 and 0.797 (splits 0.801 and 0.784): the saved
# batch norms' running statistics, trainer 0's own beside the servers' newest weights, are what is poor (with the
# data plan off too: 0.553 against 0.794).  Its comparison is reported, not held, until a save re-estimates them
# (docs/models.md).
DLRM_NOISE = pytest.mark.xfail(
    reason="a one-stage DLRM save's batch-norm running statistics lag its weights (docs/models.md)", strict=False
)


def test_a_later_stages_batch_norm_statistics_are_saved_from_its_trainer(jobs):
    worker = jobs["dlrm"]["split"]["logs"]["workerlog.0"]
    assert re.search(r"save_inference_model: \d+ running statistics of later stages from their heterogeneous", worker)
    assert "saved at their startup values" not in worker


@pytest.mark.parametrize("model", [m if m != "dlrm" else pytest.param(m, marks=DLRM_NOISE) for m in MODELS])
def test_the_saved_split_scores_as_one_stage(jobs, model):
    one, split = jobs[model]["one"]["test_auc"], jobs[model]["split"]["test_auc"]
    assert split >= one - SAME_AUC, f"the split learns worse than one stage: {summary(model, jobs[model])}"


def test_a_split_global_auc_is_the_models(jobs):
    """DNN and Wide&Deep read PaddleRec's global AUC from the scope (use_auc): on the split's CPU trainer it is the
    last stage's counts, not the 0.5 of states left at zero."""
    for model in ("dnn", "wide_deep"):
        aucs = jobs[model]["split"]["results"][0]["epoch_aucs"]
        assert len(aucs) == EPOCHS and all(0.5 < a < 1 for a in aucs), (model, aucs)
