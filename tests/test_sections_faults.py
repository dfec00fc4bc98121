"""Faults of a sectioned job end it within a bounded time, with an error naming the stage and process,
and leave no process behind; a launch that does not match the plan stops with what the plan expects."""

import json
import os
import time

import psutil
import pytest

from heterps_paddle.tools import ctr_job
from heterps_paddle.tools.section_launch import launch
from heterps_paddle.runtime.plan import launch_arguments, load_plan

JOB = os.path.abspath(ctr_job.__file__)


@pytest.fixture(scope="module")
def setup(tmp_path_factory, heterps_cache):
    tmp = tmp_path_factory.mktemp("sections-faults")
    data = str(tmp / "data")
    ctr_job.gen(data, rows=4000, seed=2)
    plans = {}
    for name, stages in {
        "two": [{"resource": "cpu_16", "layers": ["embedding_0"], "units": 1},
                {"resource": "gpu_a100", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1}],
        "three": [{"resource": "cpu_16", "layers": ["embedding_0"], "units": 1},
                  {"resource": "gpu_a100", "layers": ["fc_0"], "units": 1},
                  {"resource": "cpu_64", "layers": ["fc_1", "fc_2"], "units": 1}],
    }.items():
        path = tmp / f"{name}.json"
        path.write_text(json.dumps({"format": 1, "feasible": True, "stages": stages}))
        plans[name] = str(path)
    return tmp, data, plans


def _leftovers(marker):
    """Processes of this test's job still alive (their command line holds the unique --out path)."""
    left = []
    for p in psutil.process_iter(["cmdline"]):
        try:
            if any(marker in part for part in (p.info["cmdline"] or [])):
                left.append(p.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return left


def _run(setup, name, plan, fault, extra_env=None, epochs=1, launch_plan=None):
    tmp, data, plans = setup
    out = str(tmp / f"res_{name}")
    env = {**os.environ, "HETERPS_JOB_FAULT": fault, **(extra_env or {})}
    argv = [JOB, "--data", data, "--out", out, "--epochs", str(epochs), "--fc", "32", "32",
            "--plan", plans[plan]]
    launch_args = launch_arguments(load_plan(plans[launch_plan or plan]), 1, False)
    r = launch(plans[launch_plan or plan], argv, str(tmp / f"log_{name}"), timeout=150,
               launch_args=launch_args, env=env)
    time.sleep(0.5)
    return r, _leftovers(out)


def test_heter_trainer_that_never_starts_fails_the_job(setup):
    r, left = _run(setup, "never", "two", "heter_never_starts", {"HETERPS_STARTUP_TIMEOUT": "15"})
    assert r["returncode"] == 1 and not r["timed_out"]
    assert r["seconds"] < 90
    text = "\n".join(r["errors"])
    assert "stage 2 heterogeneous trainer 0" in text and "never started" in text, text
    assert "stage 1 CPU trainer 0" in text  # the process that noticed
    assert left == []


def test_heter_trainer_that_dies_fails_the_job(setup):
    r, left = _run(setup, "dies", "three", "heter_dies_after=3", epochs=30)
    assert r["returncode"] == 1 and not r["timed_out"]
    assert r["seconds"] < 90
    text = "\n".join(r["errors"])
    # The dead process is named by stage (the launcher numbers heter trainers in stage order; the
    # fault kills every heterogeneous trainer of the job that reaches training, stage 2 first).
    assert "stage 2 heterogeneous trainer 0" in text, text
    assert left == []


def test_launch_that_does_not_match_the_plan_stops_with_the_expected_counts(setup):
    r, left = _run(setup, "mismatch", "three", "", launch_plan="two")
    assert r["returncode"] == 1 and r["seconds"] < 90
    text = "\n".join(r["errors"])
    assert "LaunchMismatchError" in text and "expects 3 stages with [1, 1, 1]" in text, text
    assert "--heter_worker_num=1;1" in text  # what to launch instead
    assert left == []
