"""``heterps bench sections``: the unsplit CTR-DNN job against 2- and 3-stage section splits, on this machine.

Each configuration is one launched job (1 parameter server, 1 CPU trainer, and 0, 1 or 2 heterogeneous
trainers run with ``--heter_devices=cpu``) of the unchanged example trainer (examples/static_ps_trainer.py, with a
saved plan for the splits) over the same generated data.  Reported per job: samples/s over the CPU trainer's training window, held-out AUC, and
each stage's busy fraction: the CPU seconds its process(es) used inside that window divided by the
window (sampled with psutil; 1.0 = one core busy the whole time; brpc and reader threads count too).

Splitting adds processes and two RPC hops per micro-batch without adding hardware here, so on a 2-core
machine the splits are expected to be slower than the unsplit job; what matters is that they are not
N times slower (micro-batches overlap in the stages) and that busy fractions show where time goes.

No Paddle import at module level.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from typing import Any

import psutil

from heterps_paddle.files import output_dir
from heterps_paddle.planning.launch import launch_arguments
from heterps_paddle.planning.model import plan_from_dict, save_plan
from heterps_paddle.tools.jobs import JobSpec, launch, trainer_argv

SPLITS = {
    "unsplit": None,
    "2-stage": [
        {"resource": "cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 1},
        {"resource": "gpu", "kind": "gpu", "layers": ["fc_0", "fc_1", "fc_2"], "units": 1},
    ],
    "3-stage": [
        {"resource": "cpu", "kind": "cpu", "layers": ["embedding_0"], "units": 1},
        {"resource": "gpu", "kind": "gpu", "layers": ["fc_0"], "units": 1},
        {"resource": "gpu", "kind": "gpu", "layers": ["fc_1", "fc_2"], "units": 1},
    ],
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=20000, help="generated training rows (default 20000)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch", type=int, default=128, help="batch (micro-batch) size")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches in flight per stage")
    parser.add_argument("--fc", type=int, nargs="+", default=[64, 64], help="hidden fc sizes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work-dir", default=None, help="keep data, plans and logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


class _Sampler:
    """CPU time of the job's processes (found by a marker in their command line), every 0.2 s."""

    def __init__(self, marker: str):
        self.psutil = psutil
        self.marker = marker
        self.samples: dict[int, list[tuple[float, float]]] = {}
        self.role: dict[int, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            now = time.time()
            for p in self.psutil.process_iter(["cmdline"]):
                try:
                    if not any(self.marker in c for c in (p.info["cmdline"] or [])):
                        continue
                    if p.pid not in self.role:
                        env = p.environ()
                        r = env.get("TRAINING_ROLE", "launcher")
                        self.role[p.pid] = {
                            "PSERVER": "server",
                            "TRAINER": "stage 1",
                            "HETER_TRAINER": f"stage {env.get('STAGE_ID')}",
                        }.get(r, r)
                    t = p.cpu_times()
                    self.samples.setdefault(p.pid, []).append((now, t.user + t.system))
                except (self.psutil.NoSuchProcess, self.psutil.AccessDenied, ProcessLookupError):
                    pass
            self._stop.wait(0.2)

    def __enter__(self) -> _Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    @staticmethod
    def _at(samples: list[tuple[float, float]], t: float) -> float:
        """CPU seconds at wall time t, interpolated between samples."""
        if t <= samples[0][0]:
            return samples[0][1]
        for (t0, c0), (t1, c1) in zip(samples, samples[1:]):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / max(t1 - t0, 1e-9)
        return samples[-1][1]

    def busy(self, start: float, end: float) -> dict[str, float]:
        per_role: dict[str, list[float]] = {}
        for pid, samples in self.samples.items():
            if len(samples) < 2 or self.role.get(pid) == "launcher":
                continue
            cpu = self._at(samples, end) - self._at(samples, start)
            per_role.setdefault(self.role.get(pid, "?"), []).append(cpu / max(end - start, 1e-9))
        return {r: round(sum(v) / len(v), 3) for r, v in sorted(per_role.items())}


def _run_one(
    name: str,
    stages: list[dict[str, Any]] | None,
    work: str,
    args: argparse.Namespace,
    microbatches: int | None = None,
) -> dict[str, Any]:
    results = os.path.join(work, f"res_{name}")
    overrides = {
        "generate_rows": args.rows,
        "generate_seed": args.seed,
        "epochs": args.epochs,
        "batch_size": args.batch,
        "print_period": 1000000,
        "seed": args.seed,
        "model_config": {"sparse_feature_dim": 9, "fc_sizes": list(args.fc), "learning_rate": 0.003},
    }
    launch_args = ["--server_num=1", "--worker_num=1"]
    spec = JobSpec(overrides=overrides)
    if stages is not None:
        plan_path = os.path.join(work, f"plan_{name}.json")
        plan = plan_from_dict({"format": 1, "feasible": True, "stages": stages}, plan_path)
        save_plan(plan, plan_path)
        overrides["accumulate_steps"] = microbatches or args.microbatches
        spec = JobSpec(overrides=overrides, heterps=True, heterps_configs={"plan": plan_path})
        launch_args = launch_arguments(plan, 1, gpu_available=False)
    with _Sampler(results) as sampler:
        r = launch(launch_args, trainer_argv(spec, results), os.path.join(work, f"log_{name}"), timeout=900)
    if r.returncode != 0:
        raise RuntimeError(f"bench sections: the {name} job failed: {r.failures} (logs in {r.log_dir})")
    with open(os.path.join(results, "worker-0.json")) as f:
        res = json.load(f)
    window = res["train_end"] - res["train_start"]
    return {
        "samples_per_second": round(res["rows"] * res["epochs"] / window, 1),
        "train_seconds": round(window, 3),
        "microbatches": None if stages is None else (microbatches or args.microbatches),
        "heldout_auc": round(res["test_auc"], 5),
        "stages": 1 if stages is None else len(stages),
        "busy_fraction": sampler.busy(res["train_start"], res["train_end"]),
    }


def run(args: argparse.Namespace) -> int:
    if args.work_dir:
        work = output_dir("--work-dir", args.work_dir)
    else:
        work = tempfile.mkdtemp(prefix="heterps-bench-sections-")
    os.environ.setdefault("HETERPS_CACHE", os.path.join(work, "cache"))
    results = {}
    for name, stages in SPLITS.items():
        print(f"bench sections: running {name} ...", file=sys.stderr, flush=True)
        results[name] = _run_one(name, stages, work, args)
    if args.microbatches != 1:
        # The same 2-stage split with one micro-batch in flight: what the overlap of stages buys.
        print("bench sections: running 2-stage with 1 micro-batch ...", file=sys.stderr, flush=True)
        results["2-stage-1mb"] = _run_one("2-stage-1mb", SPLITS["2-stage"], work, args, microbatches=1)
    base = results["unsplit"]["samples_per_second"]
    for r in results.values():
        r["relative_to_unsplit"] = round(r["samples_per_second"] / base, 3)
    report = {
        "benchmark": "sections",
        "model": "ctr_dnn",
        "rows": args.rows,
        "epochs": args.epochs,
        "batch": args.batch,
        "microbatches": args.microbatches,
        "fc": args.fc,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "work_dir": work,
        "results": results,
    }
    if args.json:
        print(json.dumps(report))
    else:
        for name, r in results.items():
            print(
                f"{name:8s} {r['samples_per_second']:9.0f} samples/s ({r['relative_to_unsplit']:.2f}x unsplit) "
                f"held-out AUC {r['heldout_auc']:.4f}  busy {r['busy_fraction']}"
            )
    return 0
