"""Real launched parameter-server jobs (1 server, 2 workers) of the CTR-DNN example must learn."""

import os

import pytest

from heterps_paddle.tools.jobs import JobSpec, run_job

pytestmark = pytest.mark.launched  # real parameter-server jobs

ROWS, EPOCHS = 60_000, 2  # ~20 s a job here; held-out AUC ~0.78 (true-probability AUC ~0.85)


@pytest.mark.parametrize("heterps", [False, True], ids=["heterps-off", "heterps-on"])
def test_launched_ctr_dnn_learns(tmp_path, heterps_cache, heterps):
    spec = JobSpec(
        model="ctr_dnn",
        heterps=heterps,
        servers=1,
        workers=2,
        timeout=400,
        overrides={"generate_rows": ROWS, "epochs": EPOCHS},
    )
    result = run_job(spec, str(tmp_path))
    assert result.test_auc >= 0.70, result.summary()
    assert result.samples_per_second > 0
    assert len(result.worker_results) == 2
    rows = sum(r["rows"] for r in result.worker_results)
    assert rows == ROWS  # the two workers' shards cover the data set exactly once
    applied = result.worker_results[0]["meta_optimizers"]
    assert ("HeterPSOptimizer" in applied) == heterps, applied
    assert "ParameterServerOptimizer" in applied
    # progress lines (loss and AUC every print_period batches) are in the worker logs
    log = open(os.path.join(result.log_dir, "workerlog.0")).read()
    assert "loss[1]:" in log and "auc[1]:" in log
    assert "RESULT model=ctr_dnn" in log
    # with heterps on, the example config plans the job for this machine inside minimize
    assert os.path.isfile(os.path.join(str(tmp_path), "heterps_plan", "plan.json")) == heterps
