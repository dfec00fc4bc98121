"""Drop-in for split plans: the unchanged examples/static_ps_trainer.py (PaddleRec-style: config, dataset,
one train_from_dataset per epoch, held-out evaluation with forward_only_program) runs a 2-stage plan when
launched with ``--heterps --heterps-config plan=PLAN``; the extension does the rest (runtime/sections.py, runtime/heter.py, runtime/heldout.py).

Two launched jobs on the same data (conftest: data_100k, 8 files of 12,500 rows): plain async PS (no --heterps, 1
server, 2 CPU trainers) and the 2-stage split (stage 1: 2 CPU trainers with the embedding layer; stage 2: 1
heterogeneous trainer with the fc layers, loss and AUC).

Both read a QueueDataset of 3 reader threads (PaddleRec's ``runner.thread_num``) over passes of 8 files, and the
script gives every trainer all 8 (PaddleRec's ``runner.split_file_list: False``): plain Paddle (the one-stage job,
which sets no strategy.heterps) trains each file once a trainer, 16 a pass.  The split runs under the data plan's
default (runtime/pulled_pass.py: its two CPU trainers pull their shards): at least one call of a pass is handed fewer
files than threads, which the heterogeneous pipeline's kept trainer instance refused before such calls were padded
(issue 60: ``change Dataset thread_num is not supported``).  The samples counted are exactly those plain Paddle
trains.
"""

import json
import os
import re

import pytest
from conftest import heterps_eval

from heterps_paddle.launch import event_log
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import load_plan
from heterps_paddle.tools.jobs import launch

pytestmark = pytest.mark.launched  # real parameter-server jobs

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "static_ps_trainer.py")
CONFIG = os.path.join(REPO, "examples", "ctr_dnn", "config.yaml")
BATCH = 256
THREADS = 3  # over passes of 8 files: 3 + 3 + 2 at most a call, some call has fewer files than threads
FILES = 8
ROWS = 100_000  # conftest's data_100k: the training rows of a pass
# The split's held-out AUC against the one-stage job's, each one run: at 40,000 rows (2 epochs of batch 128, as long
# a job) from +0.0245 to -0.0228 (CI, 2026-11-28: 0.7522 vs 0.7750); at these 100,000 rows of batch 256 (each job
# about a minute here, 2026-11-29) one stage scored 0.7715-0.7788 in three runs, the split 0.7581-0.7719 in three and
# 0.7662-0.7712 in three more with HETERPS_DATA_PLAN=static: the split sits 0.009 under on average (so not the data
# plan's doing), one pair 0.0207 apart.  SAME_AUC holds it over three times that spread from its mean.
SAME_AUC = 0.03
TUNING = [
    "-o",
    "epochs=2",
    "-o",
    f"batch_size={BATCH}",
    "-o",
    "print_period=1000",
    "-o",
    f"thread_num={THREADS}",
    "-o",
    "split_file_list=false",
    "-o",
    "model_config={sparse_feature_dim: 9, fc_sizes: [64, 64], learning_rate: 0.003}",
]
STAGE2_TABLES = 6  # dnn_0, dnn_1, dnn_out: a weight and a bias each
# A safety net against a hung job, not a bound on its time: at a load average near 30 the split job took 194 s with
# each file trained once a pass, and ran past 240 s trained as the script asks (every file once a trainer: 160,000
# samples in 2 passes) with the data plan's multiset of offers (2026-11-28)
JOB_TIMEOUT_S = 600


@pytest.fixture(scope="module")
def jobs(tmp_path_factory, heterps_cache, data_100k):
    tmp = tmp_path_factory.mktemp("dropin-split")
    overrides = ["-o", f"train_dir={data_100k}/train", "-o", f"test_dir={data_100k}/test", *TUNING]
    plan = tmp / "plan.json"
    plan.write_text(
        json.dumps(
            {
                "format": 1,
                "feasible": True,
                "stages": [
                    {"resource": "local_cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 2},
                    {"resource": "local_gpu", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
                ],
            }
        )
    )
    out = {}
    for name in ("one", "split"):
        log_dir, res_dir = str(tmp / f"log_{name}"), str(tmp / f"res_{name}")
        argv = [SCRIPT, "-m", CONFIG, *overrides, "--result-dir", res_dir]
        if name == "one":
            r = launch(["--server_num=1", "--worker_num=2"], argv, log_dir, timeout=JOB_TIMEOUT_S)
        else:
            # the documented command line: heterps launch $(heterps launch-args plan.json) ...; the model saved
            # as PaddleRec's trainer saves it (runner.model_save_path)
            r = launch(
                launch_arguments(load_plan(str(plan)), 1, gpu_available=False),
                [*argv, "-o", f"model_save_path={tmp / 'model'}", "--heterps", "--heterps-config", f"plan={plan}"],
                log_dir,
                timeout=JOB_TIMEOUT_S,
            )
        assert r.returncode == 0, f"{name}: {r.failures}\n{r.output[-3000:]}"
        results = [json.load(open(os.path.join(res_dir, f"worker-{i}.json"))) for i in range(2)]
        logs = {
            n: open(os.path.join(log_dir, n), errors="replace").read()
            for n in os.listdir(log_dir)
            if n.startswith(("workerlog", "heterlog"))
        }
        out[name] = {"results": results, "logs": logs, "seconds": r.seconds}
        out[name]["rates"] = event_log.of_type(event_log.this_launch(event_log.read(log_dir)), "rates")
    out["model"], out["overrides"] = tmp / "model", overrides
    return out


def test_split_heldout_auc_matches_one_stage(jobs):
    one, split = jobs["one"]["results"][0]["test_auc"], jobs["split"]["results"][0]["test_auc"]
    print(
        f"\nheld-out AUC one-stage {one:.4f} ({jobs['one']['seconds']:.0f} s) | 2-stage split {split:.4f} "
        f"({jobs['split']['seconds']:.0f} s)"
    )
    assert one >= 0.70 and split >= 0.70  # a constant predictor gets 0.5
    # The split learns no worse than the one-stage job, by SAME_AUC: it is not the same optimisation (with two CPU
    # trainers feeding one heterogeneous trainer more batches are in flight, and its dense gradients go one batch at
    # a time where the one-stage job's async communicator merges them) and it sits a little under (below).
    assert split >= one - SAME_AUC, f"the split learns worse than one stage: {split:.4f} vs {one:.4f}"
    assert split <= one + 0.04, f"the split is far above one stage on the same data: {split:.4f} vs {one:.4f}"
    assert "HeterPSOptimizer" in jobs["split"]["results"][0]["meta_optimizers"]
    # worker 0 printed RESULT with the job's total (it read worker 1's file after fleet.barrier_worker())
    result = re.search(r"RESULT .*", jobs["split"]["logs"]["workerlog.0"]).group(0)
    assert "heterps=on workers=2 held-out AUC=" in result and "worker 0 only" not in result


def test_heldout_pass_used_the_servers_parameters(jobs):
    log = jobs["split"]["logs"]["workerlog.0"]
    m = re.search(
        r"heterps: held-out evaluation of the whole model .*?: (\d+) vars created here, (\d+) dense vars "
        r"pulled from the servers",
        log,
    )
    assert m and int(m.group(2)) == STAGE2_TABLES, m


def test_cpu_trainers_ran_every_epoch_and_print_the_last_stages_train_auc(jobs):
    aucs = []
    for i in range(2):
        log = jobs["split"]["logs"][f"workerlog.{i}"]
        epochs = re.findall(rf"worker {i} epoch (\d): train auc ([0-9.]+)", log)
        assert [e for e, _ in epochs] == ["0", "1"], log[-2000:]
        aucs += [float(a) for _, a in epochs]
        assert "printed here from the last stage's figures" in log  # loss/AUC fetch taken from the last stage
        assert jobs["split"]["results"][i]["epochs"] == 2
    # A model's train AUC, not nan or 0.5 (AUC states left at zero); the first epoch's, averaged over the start of
    # training, can sit just above 0.5 on a loaded machine (0.5077 and 0.539 seen, with 0.62-0.65 in the second).
    assert all(0.5 < a < 1 for a in aucs), aucs
    assert all(a > 0.55 for a in aucs[1::2]), aucs  # each trainer's last epoch


def test_saved_split_model_evaluates_as_the_job_did(jobs):
    # heterps eval: a plain Paddle PS job loads model/1 (fleet.init_server + fleet.load_inference_model)
    evaluated = heterps_eval(jobs["model"] / "1", CONFIG, jobs["overrides"])
    job = jobs["split"]["results"][0]["test_auc"]  # the servers' model right after the last save
    print(f"\nheld-out AUC of the saved split model {evaluated:.6f}, of the servers' model {job:.6f}")
    assert abs(evaluated - job) <= 1e-4


def test_heter_trainer_served_every_epoch_and_ended_by_the_takeover(jobs):
    heter = jobs["split"]["logs"]["heterlog.0"]
    assert "heterps: heterogeneous trainer taken over (stage 2)" in heter
    assert re.search(
        r"heterogeneous trainer done: served [0-9.]+ s, until every previous-stage trainer sent its "
        r"stop",
        heter,
    )
    assert "heterogeneous trainer done: stop_worker done; exit 0" in heter
    assert "SIGTERM" not in heter  # it ended itself, the launcher did not have to stop it
    # none of the script's own code after minimize ran there
    assert not re.search(r"worker \d+ epoch", heter)
    assert "RESULT" not in heter
    # It printed the loss and AUC (last stage).  Its batch count is reader thread 0 of CPU trainer 0's, a third of
    # what that trainer pulled (3 threads): no bound on the job's batches.  That every call of both passes went
    # through it shows in the CPU trainers' passes ending at all (a call waits for each batch's backward message):
    # test_every_pass_pulled_every_file_with_the_scripts_reader_threads.
    batches = [int(b) for b in re.findall(r"batch: \[(\d+)\], loss\[1\]:\[[0-9.e-]+\], auc\[1\]", heter)]
    assert batches, heter[-2000:]


def test_stage_two_dense_tables_were_pulled(jobs):
    heter = jobs["split"]["logs"]["heterlog.0"]
    m = re.search(r"heterps: dense refresh: (\d+) pulls of tables \[([0-9, ]+)\]", heter)
    assert m and int(m.group(1)) > 0
    assert len(m.group(2).split(",")) == STAGE2_TABLES


PULLED = re.compile(
    r"data plan: pass (\d+): (\d+) shards trained here in (\d+) calls \((\d+) padded to the dataset's (\d+)"
)


def pulled(jobs, name):
    """Each pass's shards trained by the job's two trainers, and its calls padded to the script's threads."""
    shards: dict[int, int] = {}
    padded = 0
    for i in range(2):
        for number, trained, _calls, short, threads in PULLED.findall(jobs[name]["logs"][f"workerlog.{i}"]):
            assert int(threads) == THREADS
            shards[int(number)] = shards.get(int(number), 0) + int(trained)
            padded += int(short)
    return shards, padded


def test_every_pass_pulled_every_file_with_the_scripts_reader_threads(jobs):
    shards, padded = pulled(jobs, "split")
    # every pass trained (each of its 8 files at least once, by whichever trainer took it)
    assert sorted(shards) == [1, 2] and all(count >= FILES for count in shards.values()), shards
    # a call of fewer files than threads came (the pass's tail) and trained, padded to the script's thread count
    assert padded >= 1, shards


PASS_FIGURES = re.compile(r"data plan: pass (\d+): \d+ files offered here; the pass: (\d+) files, (\d+) shards")


def test_a_pass_trains_each_file_once_a_trainer_it_was_given_to_as_plain_paddle_does(jobs):
    """2 trainers, each given the 8 files of 12,500 rows (100,000 a pass): each pass trains each file twice, 400,000
    samples in the 2 passes, as plain Paddle trains them."""
    shards, _ = pulled(jobs, "split")
    offered: dict[int, int] = {}
    for i in range(2):
        for number, files, pieces in PASS_FIGURES.findall(jobs["split"]["logs"][f"workerlog.{i}"]):
            assert int(files) == FILES
            offered[int(number)] = max(offered.get(int(number), 0), int(pieces))  # the second offer's: the pass
    assert shards == offered == {1: 2 * FILES, 2: 2 * FILES}, (shards, offered)  # every copy trained once
    assert jobs["split"]["rates"][-1]["samples"] == 2 * 2 * ROWS, jobs["split"]["rates"][-1]
