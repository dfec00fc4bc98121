"""``heterps bench data``: what the job's data plan (docs/data-plan.md) does for a slowed host, and what a shard
costs, measured in one run (issue 55, item 5).

**A slowed host.**  The one-stage job of ``heterps bench adapt`` (tools/bench/bench_job.py, one trainer on each of
two loopback hosts, a checkpoint after each pass, ``--adapt off``: no move, no machine asked for) three times:

- **calm**: the data plan at its default (each trainer takes the next file of the pass when it is ready for one);
- **calm, static**: ``HETERPS_DATA_PLAN=static`` (each trainer trains the files its script gave it, as before the
  data plan): what pulling costs a calm job;
- **slowed, static**: the static split, B's trainer stopped 90% of every second from the job's first measured
  window on;
- **slowed, pulled**: the same slowing at the default data plan.
- **slowed from pass 2, pulled**: the slowing from the job's first checkpoint (after pass 1) on, at the default data
  plan: the trainers' paces were measured calm, and the plan must see the slowed one's change while it trains.

The passes' files are converted to MultiSlot before the first job (tools/bench/launched.py: convert_data), so no
job measures the cold cache.  Each job's samples/s is its samples over its seconds from the slowing's start (calm: from its first measured
window) to its last window, from its coordinator's ``rates`` records (cumulative samples, every
``HETERPS_METER_S``: 1 s here, a setting of the measurement only); the figures are each over the calm job's.

**A shard's cost.**  One trainer (``heterps launch --server_num=1 --worker_num=1``, tools/bench/data_calls_job.py)
trains the same pass's files three times each way, in one ``train_from_dataset`` and in one call per file, for files of
the generated size and of a tenth of it: the cost of a call is the difference over the calls added, and its share of
a shard's training time says which file size keeps it under 2%.

The goals are the issue's, reported, never asserted.  No Paddle import here: the jobs run it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from typing import Any, Callable, Mapping, Sequence

from heterps_paddle.errors import HeterPSError
from heterps_paddle.runtime.checkpoint_files import MANIFEST
from heterps_paddle.tools.bench.launched import SLOWED_SHARE, HostsJob, convert_data, run_hosts_job, work_dir

SLOWED_GOAL = 0.8  # the slowed job's samples/s over the calm job's, with no move and no machine asked for
CALL_SHARE_GOAL = 0.02  # a call's cost over a shard's training time, at the size the docs advise
# the trainers' measurements every second, a rates record every second (what is measured, not how the job runs:
# --adapt off decides nothing on them)
METER_ENV = {"HETERPS_METER_S": "1", "HETERPS_RATES_WINDOW_S": "3"}
# (name, data plan, B slowed from: None calm, 1 its first measured window, 2 the start of pass 2): the calm job both
# ways (what pulling costs), then slowed both ways, and slowed from pass 2 on, pulled
JOBS = (
    ("calm", "pull", None),
    ("calm_static", "static", None),
    ("slowed_static", "static", 1),
    ("slowed_pulled", "pull", 1),
    ("slowed_from_pass_2_pulled", "pull", 2),
)


def rate_since(records: Sequence[Mapping[str, Any]], since: float | None) -> float | None:
    """Samples a second from ``since`` (unix seconds; None: the first window that trained) to the first ``rates``
    record with every sample of the job trained, from the records' cumulative samples (those of round 0: the job's
    own plan)."""
    rates = [r for r in records if r["type"] == "rates" and r.get("round") == 0 and r.get("samples") is not None]
    if since is None:
        trained = [r for r in rates if r.get("samples_per_s")]
        since = float(trained[0]["t"]) if trained else None
    start = next((r for r in rates if since is not None and float(r["t"]) >= since), None)
    end = next((r for r in rates if rates and int(r["samples"]) == int(rates[-1]["samples"])), None)
    if start is None or end is None or float(end["t"]) <= float(start["t"]):
        return None
    return (int(end["samples"]) - int(start["samples"])) / (float(end["t"]) - float(start["t"]))


def checkpointed(directory: str) -> Callable[[], bool]:
    """Whether a checkpoint has been written under ``directory`` (its manifest, written last): pass 1 is over."""

    def done() -> bool:
        return any(MANIFEST in names for _, _, names in os.walk(directory))

    return done


def slowed_job(args: argparse.Namespace, work: str, name: str, plan: str, slowed_from: int | None) -> dict[str, Any]:
    """One job of the one-stage plan on A and B (tools/bench/adapt.py's), B slowed from its first measured window
    (``slowed_from`` 1), from pass 2 (2) or not at all (None), the data plan ``plan``."""
    from heterps_paddle.tools.bench import adapt, bench_job

    here = os.path.join(work, name)
    argv = [bench_job.__file__, "--passes", str(args.passes), "--batch", str(args.batch)]
    argv += ["--data", os.path.join(work, "data"), "--cluster", os.path.join(work, "cluster.yaml")]
    argv += ["--out", os.path.join(here, "out")]
    options: tuple[str, ...] = ("--devices", "cpu", "--checkpoint-every", "1", "--adapt", "off")
    options += ("--checkpoint-dir", os.path.join(here, "checkpoints"))
    env = {**os.environ, **METER_ENV, "HETERPS_DATA_PLAN": plan, "HETERPS_CACHE": os.path.join(work, "cache")}
    hosts = ((adapt.A, "cpu_small, servers: 1"), (adapt.B, "cpu_small"))
    slowed = slowed_from is not None
    slowing = (adapt.B,) if slowed else ()
    slow_from = checkpointed(os.path.join(here, "checkpoints")) if slowed_from == 2 else None
    job = HostsJob("data", name, here, hosts, adapt.ONE_STAGE, argv, options, env, args.timeout, slowing, slow_from)
    ran = run_hosts_job(job)
    rate = rate_since(ran.records, ran.slowed_at if slowed else None)
    rates = [r for r in ran.records if r["type"] == "rates"]
    return {
        "data_plan": plan,
        "slowed_share": SLOWED_SHARE if slowed else 0.0,
        "slowed_from_pass": slowed_from,
        "samples": rates[-1].get("samples") if rates else None,
        "samples_per_s": None if rate is None else round(rate, 1),
        "rounds": sorted({r["round"] for r in rates}),
        "adapt_decisions": [r.get("decision") for r in ran.records if r["type"] == "adapt"],
    }


def call_costs(args: argparse.Namespace, work: str) -> list[dict[str, Any]]:
    """A call's cost, for files of the generated size and of a tenth of it (tools/bench/data_calls_job.py)."""
    source = os.path.join(work, "data", "pass-001", "train")
    small = os.path.join(work, "small")
    os.makedirs(small)
    with open(os.path.join(small, "all"), "wb") as joined:  # the same rows, in files of a tenth of the size
        for name in sorted(os.listdir(source)):
            with open(os.path.join(source, name), "rb") as f:
                shutil.copyfileobj(f, joined)
    with open(os.path.join(small, "all"), "rb") as f:
        lines = f.readlines()
    os.remove(os.path.join(small, "all"))
    per = max(1, len(lines) // (10 * len(os.listdir(source))))
    for k in range(0, len(lines), per):
        with open(os.path.join(small, f"part-{k // per:05d}"), "wb") as f:
            f.writelines(lines[k : k + per])
    out: list[dict[str, Any]] = []
    for label, directory in (("generated", source), ("tenth", small)):
        here = os.path.join(work, f"calls_{label}")
        os.makedirs(here)
        script = os.path.join(os.path.dirname(__file__), "data_calls_job.py")
        command = [sys.executable, "-m", "heterps_paddle", "launch", "--server_num=1", "--worker_num=1"]
        command += ["--log_dir", os.path.join(here, "log"), script, "--data", directory, "--batch", str(args.batch)]
        command += ["--out", os.path.join(here, "calls.json")]
        env = {**os.environ, "HETERPS_CACHE": os.path.join(work, "cache")}
        done = subprocess.run(command, env=env, cwd=here, capture_output=True, text=True, timeout=args.timeout)
        if done.returncode != 0:
            raise HeterPSError(f"bench data: the calls job ({label}) ended {done.returncode}:\n{done.stdout[-3000:]}")
        with open(os.path.join(here, "calls.json"), encoding="utf-8") as f:
            measured = json.load(f)
        files, one, each = measured["files"], min(measured["one_call_s"]), min(measured["call_per_file_s"])
        cost = (each - one) / (files - 1) if files > 1 else None
        out.append(
            {
                "files": label,
                "rows_per_file": measured["rows"] // files,
                "calls": files,
                "one_call_s": round(one, 3),
                "a_call_per_file_s": round(each, 3),
                "cost_of_a_call_s": None if cost is None else round(cost, 4),
                "share_of_a_file": None if cost is None else round(cost / (one / files), 4),
            }
        )
    return out


def call_summary(calls: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """A call's cost from the measurement with the most calls (the small files: about 80 calls, 10 s of cost against
    a second of noise; the generated size's 7 extra calls are under its noise), and its share of one file's training
    at each size."""
    best = max(calls, key=lambda c: c["calls"])
    cost = best["cost_of_a_call_s"]
    return {
        "cost_s": cost,
        "measured_with": best["files"],
        "share_of_a_file": {
            c["files"]: None if cost is None else round(cost / (c["one_call_s"] / c["calls"]), 4) for c in calls
        },
    }


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--rows", type=int, default=200000, help="rows of each pass (default 200000)")
    parser.add_argument("--passes", type=int, default=2, help="passes of each job (default 2)")
    parser.add_argument("--batch", type=int, default=128, help="batch size (default 128)")
    parser.add_argument("--seed", type=int, default=7)
    names = ", ".join(name for name, _, _ in JOBS)
    parser.add_argument(
        "--jobs",
        default=",".join(name for name, _, _ in JOBS),
        help=f"which jobs, comma-separated (default all: {names}); calm always runs, the ratios' baseline",
    )
    parser.add_argument("--no-calls", action="store_true", help="skip the measurement of a call's cost")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per job (default 900)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory (kept anyway on a failure)")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument(
        "--scale",
        action="store_true",
        help="instead: the data plan alone at 1k-100k shards and 10-1,000 simulated trainers (tools/bench/data_scale.py)",
    )


def run(args: argparse.Namespace) -> int:
    from heterps_paddle.data.generator import generate
    from heterps_paddle.tools.bench import adapt, data_scale

    if args.scale:
        return data_scale.run(args)

    if args.passes < 1 or args.rows < 160 or args.batch < 1:
        raise HeterPSError("bench data: --passes must be >= 1, --rows >= 160, --batch >= 1")
    known = [name for name, _, _ in JOBS]
    wanted = {"calm", *(name.strip() for name in args.jobs.split(",") if name.strip())}
    if wanted - set(known):
        raise HeterPSError(f"bench data: --jobs: no job {sorted(wanted - set(known))} (the jobs: {', '.join(known)})")
    if "slowed_from_pass_2_pulled" in wanted and args.passes < 3:
        raise HeterPSError("bench data: slowed_from_pass_2_pulled needs --passes 3 or more (slowed from pass 2 on)")
    report: dict[str, Any] = {"benchmark": "data", "rows": args.rows, "passes": args.passes, "batch": args.batch}
    report.update(cpu_count=os.cpu_count(), settings=dict(METER_ENV))
    with work_dir("data", args.keep) as work:
        print("bench data: generating the passes' data ...", file=sys.stderr, flush=True)
        for k in range(1, args.passes + 1):
            generate(os.path.join(work.path, "data", f"pass-{k:03d}"), args.rows, args.seed + k, 0.01)
        convert_data(os.path.join(work.path, "data"), os.path.join(work.path, "cache"))
        with open(os.path.join(work.path, "cluster.yaml"), "w") as f:
            f.write(adapt.CLUSTER)
        jobs = {}
        for name, plan, slowed_from in JOBS:
            if name in wanted:
                print(f"bench data: the {name} job ...", file=sys.stderr, flush=True)
                jobs[name] = slowed_job(args, work.path, name, plan, slowed_from)
        report["jobs"] = jobs
        if not args.no_calls:
            print("bench data: a call's cost ...", file=sys.stderr, flush=True)
            report["calls"] = call_costs(args, work.path)
            report["call"] = call_summary(report["calls"])
    calm = jobs["calm"]["samples_per_s"]
    report["over_calm"] = {
        name: None if not calm or job["samples_per_s"] is None else round(job["samples_per_s"] / calm, 3)
        for name, job in jobs.items()
        if name != "calm"
    }
    report["goals"] = {"slowed_pulled_over_calm": SLOWED_GOAL, "call_share_of_a_file": CALL_SHARE_GOAL}
    report["load_average"] = [round(x, 2) for x in os.getloadavg()]
    report["work_dir"] = work.path if work.kept else None
    print(json.dumps(report) if args.json else table(report))
    return 0


def table(report: Mapping[str, Any]) -> str:
    out = [f"passes {report['passes']} of {report['rows']} rows, batch {report['batch']}"]
    for name, job in report["jobs"].items():
        out.append(f"{name}: {job['samples_per_s']} samples/s (data plan {job['data_plan']}, rounds {job['rounds']})")
    for name, ratio in report["over_calm"].items():
        out.append(f"{name} over calm: {ratio} (goal for pulled >= {SLOWED_GOAL})")
    call: Mapping[str, Any] = report.get("call") or {}
    for c in report.get("calls", []) if call else []:
        out.append(
            f"files of {c['rows_per_file']} rows: {c['calls']} calls {c['a_call_per_file_s']} s against one "
            f"{c['one_call_s']} s; a call's cost, {call['cost_s']} s, is {call['share_of_a_file'][c['files']]} of a "
            f"file's training (goal <= {CALL_SHARE_GOAL})"
        )
    return "\n".join(out + [f"load average {report['load_average']}"])
