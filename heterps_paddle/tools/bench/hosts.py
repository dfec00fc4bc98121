"""``heterps bench hosts``: a 2-stage split across two emulated hosts over a shaped link, measured against the cost
model's prediction for the same plan with the cluster's ``links:`` at the link's rate.

Host A (10.213.0.1, type local_cpu) runs stage 1 (the embedding) on a CPU trainer and the parameter server; host C
(10.213.0.2, type local_gpu, run with ``--devices cpu``) runs stage 2 (the fc layers, loss and AUC) on a
heterogeneous trainer.  Each host is a network namespace, joined by a veth pair shaped with tc (tools/shaped_link.py),
made and removed here for each rate.  Each host runs ``heterps launch --hosts`` (tools/jobs.py: HostsRun) of the
unchanged example trainer (examples/static_ps_trainer.py) with a saved plan.

Per rate: measured samples/s in the steady state (the CPU trainer's epochs after the first: the first carries the
start-up, warm-up and connection set-up), the bytes per sample the link carried each way in that window (tc's
counters, headers included), and the prediction: the profile measured here as a job profiles itself
(program/job_profile.py: measure_job, times for local_cpu and local_gpu), this machine's cluster
(``heterps local-cluster``'s figures) with ``links: {default: rate}``, the plan evaluated by the cost model.  The
link is the model's bottleneck when the link's share of the slowest stage's time per sample is at least half.
Two readings are printed: the reference one (a stage's time is its compute plus its boundary traffic) and the
pipeline's (``CostModel(overlap=True)``: the larger of the two, the traffic overlapping the compute).

Both hosts share this machine's cores, so only the link separates them: where the link is the bottleneck the
ratio measures the model's link term; elsewhere the stages' compute on 2 shared cores dominates.

No Paddle import at module level.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
import time
from types import FrameType
from typing import Any

from heterps_paddle.errors import HeterPSError
from heterps_paddle.files import output_dir
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Cluster, Links, ModelProfile, plan_from_dict, save_plan
from heterps_paddle.tools.jobs import HostsRun, JobSpec, log_tails, trainer_argv
from heterps_paddle.tools.shaped_link import ADDRESS_A, ADDRESS_C, ShapedLink, check_can_shape, leftovers

CPU_TYPE, GPU_TYPE = "local_cpu", "local_gpu"
STAGE_1, STAGE_2 = ["embedding_0"], ["fc_0", "fc_1", "fc_2"]
# 4 Mbit/s and below fail here: the section's dense pull every HETERPS_DENSE_PULL_MS (80 KB each) fills the link and
# brpc's connect to the other host times out.
DEFAULT_RATES = [1000.0, 100.0, 20.0, 10.0]
# The link is the model's bottleneck when it takes at least this share of the slowest stage's time per sample.
LINK_BOUND_SHARE = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--rates",
        type=float,
        nargs="+",
        default=DEFAULT_RATES,
        help=f"link rates in Mbit/s, each way (default {' '.join(f'{r:g}' for r in DEFAULT_RATES)})",
    )
    parser.add_argument("--rows", type=int, default=6000, help="generated training rows (default 6000)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs; the first is left out as start-up (>= 2)")
    parser.add_argument("--batch", type=int, default=128, help="batch (micro-batch) size")
    parser.add_argument("--microbatches", type=int, default=4, help="micro-batches in flight per stage")
    parser.add_argument("--fc", type=int, nargs="+", default=[64, 64], help="hidden fc sizes")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds per job (default 600)")
    parser.add_argument("--work-dir", default=None, help="keep data, plans and logs here (default: a temp dir)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def measure_inputs(args: argparse.Namespace) -> tuple[ModelProfile, Cluster, dict[str, Any]]:
    """The profile of the trainer's model (as the job would measure it) and this machine's cluster."""
    import paddle  # lazy: the CLI imports this module at start-up

    from heterps_paddle.examples import build_program
    from heterps_paddle.measure.local_cluster import detect_local_cluster
    from heterps_paddle.program.job_profile import measure_job

    cluster = detect_local_cluster()
    main, startup, model = build_program(
        "ctr_dnn", embedding="ps", sparse_feature_dim=9, fc_sizes=tuple(args.fc), learning_rate=0.003
    )
    with paddle.static.program_guard(main, startup):
        optimizer = paddle.optimizer.Adam(0.003)
        optimizer.minimize(model.loss)
        measured = measure_job(model.loss, startup, optimizer, args.batch, args.seed, [CPU_TYPE, GPU_TYPE])
    return measured.profile, cluster, {"ps_probe_error": measured.ps_probe_error}


def predict(profile: ModelProfile, cluster: Cluster, rate_mbit: float) -> dict[str, Any]:
    """The cost model's figures for the split behind a link of ``rate_mbit`` Mbit/s."""
    link_bw = rate_mbit * 1e6 / 8
    linked = dataclasses.replace(cluster, links=Links(default=link_bw))
    model = CostModel(profile, linked, throughput=1.0)
    names = profile.layer_names()
    missing = [n for n in STAGE_1 + STAGE_2 if n not in names]
    if missing or len(names) != len(STAGE_1 + STAGE_2):
        raise HeterPSError(f"bench hosts: the profile's layers {names} are not the split's {STAGE_1 + STAGE_2}")
    types = {t.name: i for i, t in enumerate(linked.resource_types)}
    assignment = [types[CPU_TYPE] if n in STAGE_1 else types[GPU_TYPE] for n in names]
    evaluation = model.evaluate(assignment)
    slowest = max(evaluation.stages, key=lambda s: s.time_per_sample)
    share = model.boundary_seconds(slowest.start, slowest.end, slowest.type_index) / slowest.time_per_sample
    stages = [
        {
            "layers": names[s.start : s.end],
            "seconds_per_sample": s.time_per_sample,
            "link": model.boundary_seconds(s.start, s.end, s.type_index),
        }
        for s in evaluation.stages
    ]
    # The pipeline's reading (CostModel overlap): a stage's boundary traffic overlaps its compute.  The link binds
    # in it exactly where it does in the reference reading (link share >= 0.5: the traffic at least the compute).
    overlapped = CostModel(profile, linked, throughput=1.0, overlap=True).evaluate(assignment)
    return {
        "samples_per_second": evaluation.throughput,
        "overlap_samples_per_second": overlapped.throughput,
        "link_share": share,
        "link_bound": share >= LINK_BOUND_SHARE,
        "link_bytes_per_sample": model.boundary_bytes(0, len(STAGE_1)),
        # The model's link term alone (no compute): separates a miss of the link term from one of the profile.
        "link_only_samples_per_second": 1.0
        / max(model.boundary_seconds(s.start, s.end, s.type_index) for s in evaluation.stages),
        "stages": stages,
    }


class _Interrupted(BaseException):
    """SIGTERM, turned into an exception so the namespaces and the job are removed on the way out."""


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    raise _Interrupted(f"signal {signum}")


def _bytes_at(samples: list[tuple[float, dict[str, int]]], t: float, address: str) -> float:
    """The link's bytes sent by ``address``'s end at wall time ``t``, interpolated between polls."""
    for (t0, b0), (t1, b1) in zip(samples, samples[1:]):
        if t0 <= t <= t1:
            return b0[address] + (b1[address] - b0[address]) * (t - t0) / max(t1 - t0, 1e-9)
    raise HeterPSError(
        f"bench hosts: no link counters around {t:.1f} (polled {samples[0][0]:.1f}..{samples[-1][0]:.1f})"
    )


def run_rate(rate: float, plan_path: str, work: str, args: argparse.Namespace) -> dict[str, Any]:
    """One job over a link of ``rate`` Mbit/s: steady samples/s and the link's bytes per sample each way."""
    name = f"rate_{rate:g}"
    job_dir = os.path.join(work, name)
    os.makedirs(job_dir, exist_ok=True)
    results = os.path.join(job_dir, "results")
    overrides = {
        "generate_rows": args.rows,
        "generate_seed": args.seed,
        "epochs": args.epochs,
        "batch_size": args.batch,
        "print_period": 1000000,
        "seed": args.seed,
        "accumulate_steps": args.microbatches,
        "model_config": {"sparse_feature_dim": 9, "fc_sizes": list(args.fc), "learning_rate": 0.003},
    }
    spec = JobSpec(overrides=overrides, heterps=True, heterps_configs={"plan": plan_path})
    with ShapedLink(rate) as link:
        hosts_path = os.path.join(job_dir, "hosts.yaml")
        # Fresh namespaces: every port is free there, so the default base port serves.
        with open(hosts_path, "w") as f:
            f.write(
                f"format: 1\nhosts:\n  - {{address: {ADDRESS_A}, type: {CPU_TYPE}}}\n"
                f"  - {{address: {ADDRESS_C}, type: {GPU_TYPE}}}\n"
            )
        run = HostsRun(
            hosts_path,
            plan_path,
            trainer_argv(spec, results),
            job_dir,
            env=dict(os.environ),
            timeout=args.timeout,
            prefix={a: link.prefix_command(a) for a in (ADDRESS_A, ADDRESS_C)},
        )
        counters: list[tuple[float, dict[str, int]]] = []
        try:
            for address in (ADDRESS_A, ADDRESS_C):
                run.start(address)
            deadline = time.monotonic() + args.timeout + 60
            while any(h.proc.poll() is None for h in run.hosts.values()) and time.monotonic() < deadline:
                counters.append((time.time(), link.sent_bytes()))
                time.sleep(0.25)
            codes = run.wait(timeout=0)
        finally:
            run.stop()
    if codes != {ADDRESS_A: 0, ADDRESS_C: 0}:
        consoles = "\n".join(f"--- host {a} console\n{h.console()[-3000:]}" for a, h in run.hosts.items())
        tails = "\n".join(log_tails(h.log_dir) for h in run.hosts.values())
        raise HeterPSError(f"bench hosts: the job at {rate:g} Mbit/s failed: exit {codes}\n{consoles}\n{tails}")
    with open(os.path.join(results, "worker-0.json")) as f:
        res = json.load(f)
    ends = res["epoch_ends"]
    window = ends[-1] - ends[0]
    steady_rows = res["rows"] * (len(ends) - 1)
    sent = {a: _bytes_at(counters, ends[-1], a) - _bytes_at(counters, ends[0], a) for a in (ADDRESS_A, ADDRESS_C)}
    return {
        "samples_per_second": steady_rows / window,
        "steady_seconds": window,
        "steady_rows": steady_rows,
        "link_bytes_per_sample": {
            "stage 1 -> stage 2": sent[ADDRESS_A] / steady_rows,
            "stage 2 -> stage 1": sent[ADDRESS_C] / steady_rows,
        },
        "heldout_auc": res["test_auc"],
    }


def run(args: argparse.Namespace) -> int:
    if args.epochs < 2:
        raise HeterPSError("bench hosts: --epochs must be >= 2 (the first epoch is left out as start-up)")
    if any(not r > 0 for r in args.rates):
        raise HeterPSError(f"bench hosts: --rates must be positive Mbit/s, got {args.rates}")
    if args.work_dir:
        output_dir("--work-dir", args.work_dir)
    check_can_shape()
    work = args.work_dir or tempfile.mkdtemp(prefix="heterps-bench-hosts-")
    os.environ.setdefault("HETERPS_CACHE", os.path.join(work, "cache"))
    print("bench hosts: measuring this machine's cluster and the model's profile ...", file=sys.stderr, flush=True)
    profile, cluster, notes = measure_inputs(args)
    plan_path = os.path.join(work, "plan.json")
    stages = [
        {"resource": CPU_TYPE, "kind": "cpu", "layers": STAGE_1, "units": 1},
        {"resource": GPU_TYPE, "kind": "gpu", "layers": STAGE_2, "units": 1},
    ]
    save_plan(plan_from_dict({"format": 1, "feasible": True, "stages": stages}, plan_path), plan_path)

    previous = signal.signal(signal.SIGTERM, _on_sigterm)
    prefix = f"hps-{os.getpid()}-"
    rows = []
    try:
        for rate in args.rates:
            print(f"bench hosts: running the split over a {rate:g} Mbit/s link ...", file=sys.stderr, flush=True)
            measured = run_rate(rate, plan_path, work, args)
            predicted = predict(profile, cluster, rate)
            rows.append(
                {
                    "rate_mbit": rate,
                    "measured_samples_per_second": round(measured["samples_per_second"], 1),
                    "predicted_samples_per_second": round(predicted["samples_per_second"], 1),
                    "ratio": round(measured["samples_per_second"] / predicted["samples_per_second"], 3),
                    "predicted_overlap_samples_per_second": round(predicted["overlap_samples_per_second"], 1),
                    "ratio_overlap": round(measured["samples_per_second"] / predicted["overlap_samples_per_second"], 3),
                    "link_bound": predicted["link_bound"],
                    "link_share": round(predicted["link_share"], 3),
                    "measured": measured,
                    "predicted": predicted,
                }
            )
    finally:
        signal.signal(signal.SIGTERM, previous)
        left = leftovers(prefix)
        if left:
            print(f"bench hosts: namespaces left behind: {left}", file=sys.stderr)
    report = {
        "benchmark": "hosts",
        "model": "ctr_dnn",
        "plan": {"stage 1": f"{STAGE_1} on {CPU_TYPE} (host A)", "stage 2": f"{STAGE_2} on {GPU_TYPE} (host C)"},
        "rows": args.rows,
        "epochs": args.epochs,
        "batch": args.batch,
        "microbatches": args.microbatches,
        "fc": args.fc,
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "work_dir": work,
        "notes": notes,
        "results": rows,
    }
    if args.json:
        print(json.dumps(report))
    else:
        print(
            f"{'Mbit/s':>8} {'measured':>10} {'predicted':>10} {'ratio':>6} {'overlap':>10} {'ratio':>6}  "
            "bottleneck (link share)"
        )
        for r in rows:
            what = "link" if r["link_bound"] else "compute"
            print(
                f"{r['rate_mbit']:8g} {r['measured_samples_per_second']:10.0f} "
                f"{r['predicted_samples_per_second']:10.0f} {r['ratio']:6.2f} "
                f"{r['predicted_overlap_samples_per_second']:10.0f} {r['ratio_overlap']:6.2f}  {what} "
                f"({r['link_share']:.2f})"
            )
        print(f"load average {report['load_average']}, work dir {work}")
    return 0
