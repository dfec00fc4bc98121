"""Run the example trainer as a real job (launched PS job, or one process) and collect its figures.

Used by the benchmarks and the tests, so both measure exactly what a user runs: the same script, the
same launcher, real server and worker processes.  A job runs in its own process group and is killed
whole on timeout, so nothing is left behind.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field

from heterps_paddle.errors import HeterPSError


class JobFailed(HeterPSError):
    """A launched job exited badly or left no results; the message carries its log tails."""


@dataclass
class JobSpec:
    model: str = "ctr_dnn"
    heterps: bool = False
    servers: int = 1
    workers: int = 2  # 0: one process, no parameter server (the learning reference)
    overrides: dict = field(default_factory=dict)  # run config keys, e.g. {"generate_rows": 200000}
    heterps_configs: dict = field(default_factory=dict)
    launch_args: tuple = ()  # extra paddle.distributed.launch arguments
    timeout: float = 600.0


@dataclass
class JobResult:
    spec: JobSpec
    samples_per_second: float  # summed over workers
    test_auc: float
    wall_seconds: float
    log_dir: str
    worker_results: list

    def summary(self) -> dict:
        return {"model": self.spec.model, "heterps": self.spec.heterps, "workers": self.spec.workers,
                "servers": self.spec.servers if self.spec.workers else 0,
                "samples_per_second": round(self.samples_per_second, 1), "test_auc": round(self.test_auc, 4),
                "wall_seconds": round(self.wall_seconds, 1)}


def _log_tails(log_dir: str, lines: int = 15) -> str:
    out = []
    if os.path.isdir(log_dir):
        for name in sorted(os.listdir(log_dir)):
            path = os.path.join(log_dir, name)
            if os.path.isfile(path):
                with open(path, errors="replace") as f:
                    tail = [l for l in f.read().splitlines() if l.strip()][-lines:]
                out.append(f"--- {path} (last {len(tail)} lines)\n" + "\n".join(tail))
    return "\n".join(out)


def command_for(spec: JobSpec, log_dir: str, result_dir: str) -> list:
    from heterps_paddle.examples import TRAINER_SCRIPT, model_config_path

    script = [TRAINER_SCRIPT, "-m", model_config_path(spec.model), "--result-dir", result_dir]
    for key, value in spec.overrides.items():
        script += ["-o", f"{key}={json.dumps(value)}"]
    if spec.heterps:
        script.append("--heterps")
        for key, value in spec.heterps_configs.items():
            script += ["--heterps-config", f"{key}={json.dumps(value)}"]
    if spec.workers == 0:
        return [sys.executable, "-u"] + script
    return ([sys.executable, "-m", "paddle.distributed.launch", f"--server_num={spec.servers}",
             f"--worker_num={spec.workers}", "--log_dir", log_dir, *spec.launch_args] + script)


def run_job(spec: JobSpec, work_dir: str) -> JobResult:
    """Run ``spec`` with ``work_dir`` as its working directory; raise JobFailed with the logs' tails
    if it fails, times out or leaves no result."""
    log_dir = os.path.join(work_dir, "log")
    result_dir = os.path.join(work_dir, "results")
    os.makedirs(log_dir, exist_ok=True)
    cmd = command_for(spec, log_dir, result_dir)
    start = time.time()
    with open(os.path.join(log_dir, "launcher.log"), "w") as launcher_log:
        proc = subprocess.Popen(cmd, cwd=work_dir, stdout=launcher_log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=spec.timeout)
        except subprocess.TimeoutExpired:
            returncode = None
        finally:
            # Whatever happened, leave no server, worker or launcher behind.
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
    wall = time.time() - start
    expected = max(spec.workers, 1)
    results = []
    for i in range(expected):
        path = os.path.join(result_dir, f"worker-{i}.json")
        if os.path.isfile(path):
            with open(path) as f:
                results.append(json.load(f))
    if returncode is None:
        raise JobFailed(f"job timed out after {spec.timeout:.0f} s: {' '.join(cmd)}\n{_log_tails(log_dir)}")
    if returncode != 0 or len(results) != expected or "test_auc" not in results[0]:
        raise JobFailed(f"job failed (exit status {returncode}, results from {len(results)} of {expected} "
                        f"workers): {' '.join(cmd)}\n{_log_tails(log_dir)}")
    return JobResult(spec=spec, samples_per_second=sum(r["samples_per_second"] for r in results),
                     test_auc=results[0]["test_auc"], wall_seconds=wall, log_dir=log_dir, worker_results=results)
