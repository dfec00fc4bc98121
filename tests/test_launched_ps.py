"""Real launched parameter-server jobs (1 server, 2 workers) of the CTR-DNN example must learn; with heterps on, what
the job costs and trains is measured (docs/metrics.md): its metrics endpoint scraped while it runs, ``heterps status``
after it, and its console agree with each other and with the samples it trained (counted: its rows, its epochs)."""

import json
import os
import re
import threading

import pytest
from conftest import scrape_until

from heterps_paddle.tools.jobs import JobSpec, free_port_block, run_job
from heterps_paddle.tools.status_command import run as status_run

pytestmark = pytest.mark.launched  # real parameter-server jobs

ROWS, EPOCHS = 60_000, 2  # ~20 s a job here; held-out AUC ~0.78 (true-probability AUC ~0.85)


@pytest.mark.parametrize("heterps", [False, True], ids=["heterps-off", "heterps-on"])
def test_launched_ctr_dnn_learns(tmp_path, heterps_cache, heterps):
    port = free_port_block("127.0.0.1", 1)
    spec = JobSpec(
        model="ctr_dnn",
        heterps=heterps,
        servers=1,
        workers=2,
        timeout=400,
        overrides={"generate_rows": ROWS, "epochs": EPOCHS},
        launch_args=("--metrics-port", str(port)) if heterps else (),
    )
    scrapes, stop = [], threading.Event()
    scraper = threading.Thread(target=scrape_until, args=(port, stop, scrapes), daemon=True)
    scraper.start()
    try:
        result = run_job(spec, str(tmp_path))
    finally:
        stop.set()
        scraper.join(30)
    assert result.test_auc >= 0.70, result.summary()
    assert result.samples_per_second > 0
    assert len(result.worker_results) == 2
    rows = sum(r["rows"] for r in result.worker_results)
    assert rows == ROWS  # the two workers' shards cover the data set exactly once
    applied = result.worker_results[0]["meta_optimizers"]
    assert ("HeterPSOptimizer" in applied) == heterps, applied
    assert "ParameterServerOptimizer" in applied
    # progress lines (loss and AUC every print_period batches) are in the worker logs: with heterps on the two
    # workers pull the pass's files, so which of them reaches print_period batches in a pass is the run's
    logs = [open(os.path.join(result.log_dir, f"workerlog.{i}")).read() for i in range(2)]
    assert any("loss[1]:" in text and "auc[1]:" in text for text in logs)
    log = logs[0]
    assert "RESULT model=ctr_dnn" in log
    # with heterps on, the example config plans the job for this machine inside minimize
    assert os.path.isfile(os.path.join(str(tmp_path), "heterps_plan", "plan.json")) == heterps
    if heterps:
        measured_agrees(result, scrapes, ROWS * EPOCHS, capsys=None)
        priced_as_its_report(result, scrapes, os.path.join(str(tmp_path), "heterps_plan", "plan_report.txt"))


def metric(text, name):
    found = re.search(rf"^{name} ([0-9.e+-]+)$", text, re.MULTILINE)
    return None if found is None else float(found.group(1))


def measured_agrees(result, scrapes, trained, capsys):
    """Status, console and metrics of a finished job agree with each other and with the ``trained`` samples."""
    import argparse
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert status_run(argparse.Namespace(log_dir=result.log_dir, json=True, plot=None)) == 0
    status = json.loads(out.getvalue())
    assert status["state"] == "ended" and status["samples"] == trained, status
    assert status["samples_per_s_last_window"] is not None and status["stages"], status
    # the console's last line of the job says the same samples (its lines are made from the same rates)
    console = open(os.path.join(result.log_dir, "launcher.out")).read()
    said = re.findall(
        r"heterps launch: job \(round \d+\): [0-9,]+ samples/s over the last \d+ s, ([0-9,]+) samples trained", console
    )
    assert said and int(said[-1].replace(",", "")) == trained, said
    # the endpoint, scraped while the job ran: each scrape is one of the log's rates records, never ahead of it
    rates = [
        json.loads(line) for line in open(os.path.join(result.log_dir, "heterps-events.jsonl")) if '"rates"' in line
    ]
    logged = {r["samples"] for r in rates}
    seen = [metric(text, "heterps_samples_trained_total") for text in scrapes]
    seen = [int(v) for v in seen if v is not None]
    assert seen, f"no scrape while the job ran ({len(scrapes)} answers)"
    assert set(seen) <= logged and seen == sorted(seen), (seen, sorted(logged))


def priced_as_its_report(result, scrapes, report_path):
    """Issue 53: the README's job (cluster: local) shows what it costs from the prices its report used, live and
    after the end; over the job, cost per million samples is cost so far over samples, and the cost so far is the
    plan's price for the time the job held its units."""
    import argparse
    import contextlib
    import io

    from heterps_paddle.launch.figures import of_log

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert status_run(argparse.Namespace(log_dir=result.log_dir, json=True, plot=None)) == 0
    status = json.loads(out.getvalue())
    per_hour = status["cost_per_hour"]
    report = open(report_path).read()
    assert per_hour is not None, status  # it was "cost unknown (no prices)" whichever trainer had planned
    assert re.search(rf"predicted [0-9,]+ samples/s, {per_hour:g}/h", report), (per_hour, report)
    assert status["cost_per_million_samples_over_job"] == pytest.approx(
        status["cost_so_far"] / status["samples"] * 1e6, rel=1e-4
    )
    # paid from the round's start, its units' price known once trainer 0 published the plan
    assert status["cost_so_far"] == pytest.approx(per_hour * status["seconds_over_job"] / 3600, rel=0.05), status
    # an ended job leads with its figures over the job, not with an idle last window
    lines = of_log(result.log_dir).lines()
    assert lines[1].startswith(f"over the job: {status['samples']:,} samples in "), lines
    console = open(os.path.join(result.log_dir, "launcher.out")).read()
    assert re.search(r"heterps launch: over the job: [0-9,]+ samples in [0-9,]+ s, [0-9,]+ samples/s; cost ", console)
    assert "cost unknown" not in console
    # is it learning? the last pass's AUC as the model's own AUC op gives it, beside the cost (issue 53, item 4)
    learning = status["learning"]
    assert learning["passes"] == 2 and 0.51 < learning["auc"] < 1 and learning["finite"] is True, learning
    assert learning["verdict"] is None and "NOT LEARNING" not in console
    assert re.search(r"over the job: .*; last pass 2: AUC 0\.\d{4}", console)
    # the endpoint had a cost series while the job ran
    costs = [metric(text, "heterps_cost_total") for text in scrapes]
    assert any(c is not None and c > 0 for c in costs), f"no cost in {len(scrapes)} scrapes"
