"""``heterps bench scheduler``: every scheduler on a seeded suite of planning workloads, against ``exact``.

The suite: generated CTR-like models (4 to 64 layers) on 2 to 16 resource types drawn from the catalog of real
CPU and GPU kinds (some with a binding shared unit limit), plus the example CTR models' profiles on the example
clusters. Printed per scheduler: cost ratio to the proven optimum (median, worst) and search time.

``--scale``: instead, the sizes exact must prove optimal quickly (``catalog.scale_suite``: 64x16 to 200 layers x
64 types, shared limits binding or not), each workload's line giving every scheduler's ratio and seconds.

``--tight``: instead, mid-size cases whose shared unit limits bind hard (``catalog.tight_suite``: 16-64 layers x
4-16 types, the limited optimum 1.18x-1.40x the unlimited one), one line each.

``--rl-seeds K``: rl runs with seeds 0..K-1 on each workload; its ratio there is the median over the seeds, and
the worst is reported beside it (per workload and over the suite).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import sys
import time
from typing import Any, Callable

import numpy as np

from heterps_paddle.files import output_file, pyplot, save_figure_atomic
from heterps_paddle.planning.catalog import (
    Workload,
    feasible_target,
    interesting_throughput,
    scale_suite,
    tight_suite,
    unlimited_optimum,
    workload_suite,
)
from heterps_paddle.planning.cost_model import CostModel
from heterps_paddle.planning.model import Plan, PlanningInputError, load_cluster
from heterps_paddle.planning.schedulers import SCHEDULERS, make_scheduler
from heterps_paddle.planning.schedulers.refine import descend

# brute is exponential: run it only where it takes seconds, not minutes (its own refusal is at 10^6).
BRUTE_BENCH_LIMIT = 200_000
# Not a scheduler: rl's refinement alone, from the cheapest single-type plan (the one with the fewest units over
# the limits when none keeps them), to show what rl's policy adds to it (`--schedulers exact,rl,descent`).
DESCENT_ONLY = "descent"


def descent_only(cost_model: CostModel) -> Plan:
    started = time.perf_counter()
    start = min(cost_model.single_type_evaluations(), key=lambda e: (e.excess_units, e.cost_per_hour))
    refined = descend(cost_model, np.array(start.assignment))
    return cost_model.to_plan(
        refined.assignment if refined.feasible else None,
        DESCENT_ONLY,
        search_seconds=time.perf_counter() - started,
        reason=None if refined.feasible else refined.reason,
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, default=24, help="generated workloads (default 24)")
    parser.add_argument("--seed", type=int, default=0, help="suite seed (default 0)")
    parser.add_argument(
        "--scale",
        action="store_true",
        help="the large workloads instead (64x16, 64x32, 128x64, 200x64; limits binding or not); no examples",
    )
    parser.add_argument(
        "--tight",
        action="store_true",
        help="mid-size workloads whose shared limits bind hard (16-64 layers x 4-16 types); no examples",
    )
    parser.add_argument(
        "--rl-seeds", type=int, default=1, help="run rl with seeds 0..K-1: median and worst ratio (default 1)"
    )
    parser.add_argument(
        "--schedulers",
        default=",".join(SCHEDULERS),
        help=f"comma list (default: {','.join(SCHEDULERS)}; also '{DESCENT_ONLY}': rl's refinement alone)",
    )
    parser.add_argument(
        "--no-examples", action="store_true", help="leave out the example CTR models (profiling them needs Paddle)"
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")
    parser.add_argument("--plot", default=None, metavar="FILE.png", help="draw ratios and times (matplotlib)")


def example_workloads() -> list[Workload]:
    """The example models' static profiles (sizes only: no timing run) on each example cluster."""
    # Imported here: the profiler imports Paddle (an ImportError without it: run() leaves the examples out), the
    # CLI imports this module at start-up, and heterps_paddle.examples exists only once installed.
    from heterps_paddle.examples import EXAMPLES_DIR, MODELS
    from heterps_paddle.tools.profile_command import profile_example

    # *_hosts.yaml are hosts files beside the cluster they name (planning/hosts.py), not clusters.
    clusters = sorted(
        p for p in glob.glob(os.path.join(EXAMPLES_DIR, "clusters", "*.yaml")) if not p.endswith("_hosts.yaml")
    )
    workloads = []
    for model_name in MODELS:
        profile = profile_example(model_name, time_key=None, measure=False).profile
        for index, path in enumerate(clusters):
            cluster = load_cluster(path)
            target = interesting_throughput(profile, cluster, seed=index)
            name = f"{model_name}@{os.path.basename(path)[:-5]}"
            workloads.append(Workload(name, profile, feasible_target(profile, cluster.with_throughput(target)), False))
    return workloads


def run_suite(
    workloads: list[Workload],
    schedulers: list[str],
    log: Callable[[str], None] | None = None,
    rl_seeds: int = 1,
    unlimited: bool = False,
) -> list[dict[str, Any]]:
    """Every scheduler on every workload (exact first: the others' ratios are to its optimum); rl with
    ``rl_seeds`` seeds; ``unlimited``: also the optimum with every limit lifted (``unlimited_ratio``: it over the
    limited one)."""
    rows = []
    for workload in workloads:
        n, T = len(workload.profile.layers), len(workload.cluster.resource_types)
        row: dict[str, Any] = {
            "workload": workload.name,
            "layers": n,
            "types": T,
            "binding_limit": workload.binding_limit,
            "throughput": workload.cluster.throughput,
            "results": {},
        }
        for name in ["exact"] + [s for s in schedulers if s != "exact"]:
            if name == "brute" and T**n > BRUTE_BENCH_LIMIT:
                row["results"][name] = {"skipped": f"{T}^{n} assignments"}
                continue
            runs = []
            for seed in range(rl_seeds if name == "rl" else 1):
                cost_model = CostModel(workload.profile, workload.cluster)
                started = time.perf_counter()
                plan = (
                    descent_only(cost_model)
                    if name == DESCENT_ONLY
                    else make_scheduler(name, seed=seed).plan(cost_model)
                )
                result: dict[str, Any] = {
                    "feasible": plan.feasible,
                    "cost_per_hour": plan.cost_per_hour if plan.feasible else None,
                    "seconds": time.perf_counter() - started,
                    "evaluations": plan.evaluations,
                }
                if plan.refined_from_cost is not None:
                    result["refined_from_cost"] = plan.refined_from_cost
                runs.append(result)
            if len(runs) == 1:
                row["results"][name] = runs[0]
            else:  # the median seed's run, with every seed's beside it
                ranked = sorted(runs, key=lambda r: np.inf if r["cost_per_hour"] is None else r["cost_per_hour"])
                row["results"][name] = dict(
                    ranked[len(ranked) // 2],
                    seconds=max(r["seconds"] for r in runs),
                    seeds=runs,
                )
        optimum = row["results"]["exact"]["cost_per_hour"]
        for result in row["results"].values():
            if "skipped" in result or optimum is None:
                continue
            result["ratio"] = _ratio(result["cost_per_hour"], optimum)
            if "seeds" in result:
                for run in result["seeds"]:
                    run["ratio"] = _ratio(run["cost_per_hour"], optimum)
                seed_ratios = [r["ratio"] for r in result["seeds"]]
                if None not in seed_ratios:
                    result["ratio"] = statistics.median(seed_ratios)
                result["worst_ratio"] = None if None in seed_ratios else max(seed_ratios)
        if unlimited and optimum:
            row["unlimited_ratio"] = unlimited_optimum(workload.profile, workload.cluster)[0] / optimum
        rows.append(row)
        if log:
            log(_row_line(row))
    return rows


def _ratio(cost: float | None, optimum: float) -> float | None:
    """Cost over the optimum (1 where both are 0; None without a plan)."""
    return cost / optimum if cost is not None and optimum > 0 else (1.0 if cost == optimum else None)


def summarise(rows: list[dict[str, Any]], schedulers: list[str]) -> dict[str, Any]:
    summary = {}
    for name in schedulers:
        ratios, seconds, missed, ran = [], [], 0, 0
        worst: list[float | None] = []  # per workload, the worst over rl's seeds (when it ran several)
        for row in rows:
            result = row["results"].get(name)
            if result is None or "skipped" in result or row["results"]["exact"]["cost_per_hour"] is None:
                continue
            ran += 1
            seconds.append(result["seconds"])
            if result.get("ratio") is None:
                missed += 1  # no feasible plan where one exists
            else:
                ratios.append(result["ratio"])
                if "seeds" in result:
                    worst.append(result["worst_ratio"])
        summary[name] = {
            "workloads": ran,
            "no_plan": missed,
            "median_ratio": statistics.median(ratios) if ratios else None,
            "worst_ratio": max(ratios) if ratios else None,  # over the workloads it found a plan for
            # over the workloads and every seed (rl with --rl-seeds; None where a seed found no plan)
            "worst_seed_ratio": (None if None in worst else max(w for w in worst if w is not None)) if worst else None,
            "optimal_share": sum(r <= 1 + 1e-9 for r in ratios) / ran if ran else None,
            "median_seconds": statistics.median(seconds) if seconds else None,
            "max_seconds": max(seconds) if seconds else None,
        }
    return summary


def _row_line(row: dict[str, Any]) -> str:
    optimum = row["results"]["exact"]["cost_per_hour"]
    parts = [
        f"{row['workload']:<28} {row['layers']:>3}x{row['types']:<3} {'bind' if row['binding_limit'] else '    '} "
        f"optimum {'none' if optimum is None else format(optimum, '.4g') + '/h':<9}"
    ]
    for name, result in row["results"].items():
        if "skipped" in result:
            parts.append(f"{name}=skip")
        elif result.get("ratio") is None:
            parts.append(f"{name}=none({result['seconds']:.1f}s)")
        elif "seeds" in result:  # median/worst over the seeds (the slowest seed's seconds)
            worst = "none" if result["worst_ratio"] is None else format(result["worst_ratio"], ".3f")
            parts.append(f"{name}={result['ratio']:.3f}/{worst}({result['seconds']:.1f}s)")
        else:
            parts.append(f"{name}={result['ratio']:.3f}({result['seconds']:.1f}s)")
    if "unlimited_ratio" in row:
        parts.append(f"unlimited={row['unlimited_ratio']:.3f}")
    return " ".join(parts)


def run(args: argparse.Namespace) -> int:
    schedulers = [s.strip() for s in args.schedulers.split(",") if s.strip()]
    for name in schedulers:
        if name not in SCHEDULERS and name != DESCENT_ONLY:
            raise PlanningInputError(f"--schedulers: unknown scheduler {name!r}")
    if "exact" not in schedulers:
        schedulers.insert(0, "exact")
    if args.scale and args.tight:
        raise PlanningInputError("--scale and --tight are two suites: give one")
    if args.rl_seeds < 1:
        raise PlanningInputError(f"--rl-seeds must be at least 1, not {args.rl_seeds}")
    if args.plot:
        output_file("--plot", args.plot)  # before the suite runs, not after
    if args.scale:
        workloads = scale_suite(args.seed)
    elif args.tight:
        workloads = tight_suite(args.seed)
    else:
        workloads = workload_suite(args.count, args.seed)

    def log(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if not (args.no_examples or args.scale or args.tight):
        try:
            workloads += example_workloads()
        except ImportError as exc:  # the examples need Paddle to build their programs
            log(f"example models left out: {exc}")
    rows = run_suite(workloads, schedulers, log=log, rl_seeds=args.rl_seeds, unlimited=args.tight)
    summary = summarise(rows, schedulers)
    if args.plot:
        plot_bench(rows, summary, schedulers, args.plot)
        log(f"wrote {args.plot}")
    if args.json:
        print(
            json.dumps(
                {
                    "benchmark": "scheduler",
                    "seed": args.seed,
                    "scale": args.scale,
                    "tight": args.tight,
                    "rl_seeds": args.rl_seeds,
                    "workloads": rows,
                    "summary": summary,
                }
            )
        )
    else:
        if args.scale or args.tight:  # few workloads, each its own question: one line each
            for row in rows:
                print(_row_line(row))
        print(
            f"{'scheduler':<10} {'median ratio':>12} {'worst ratio':>12} {'optimal':>8} {'no plan':>8} "
            f"{'median s':>9} {'max s':>8}  (ratio = cost / exact's proven optimum; {len(rows)} workloads"
            + (f"; rl: median seed, worst over {args.rl_seeds} seeds" if args.rl_seeds > 1 else "")
            + ")"
        )
        for name, s in summary.items():

            def fmt(value: float | None, pattern: str) -> str:
                return "-" if value is None else format(value, pattern)

            worst = s["worst_seed_ratio"] if s["worst_seed_ratio"] is not None else s["worst_ratio"]
            print(
                f"{name:<10} {fmt(s['median_ratio'], '12.4f')} {fmt(worst, '12.4f')} "
                f"{fmt(s['optimal_share'], '8.0%')} {s['no_plan']:>8} {fmt(s['median_seconds'], '9.2f')} "
                f"{fmt(s['max_seconds'], '8.2f')}"
            )
    return 0


def plot_bench(rows: list[dict[str, Any]], summary: dict[str, Any], schedulers: list[str], path: str) -> None:
    plt = pyplot()  # matplotlib is optional (the plot extra), and only --plot needs it
    figure, (ratio_axis, time_axis) = plt.subplots(1, 2, figsize=(12, 4.5))
    for position, name in enumerate(schedulers):
        ratios = [
            r["results"][name]["ratio"]
            for r in rows
            if name in r["results"] and r["results"][name].get("ratio") is not None
        ]
        seconds = [
            r["results"][name]["seconds"] for r in rows if name in r["results"] and "seconds" in r["results"][name]
        ]
        ratio_axis.scatter([position] * len(ratios), ratios, alpha=0.6)
        time_axis.scatter([position] * len(seconds), seconds, alpha=0.6)
    for axis, label in ((ratio_axis, "cost / optimum"), (time_axis, "search seconds")):
        axis.set_xticks(range(len(schedulers)))
        axis.set_xticklabels(schedulers)
        axis.set_ylabel(label)
    ratio_axis.set_yscale("log")
    time_axis.set_yscale("log")
    ratio_axis.set_title(f"cost ratio to exact ({len(rows)} workloads)")
    time_axis.set_title("search time")
    figure.tight_layout()
    save_figure_atomic(figure, path)
    plt.close(figure)
