"""``heterps bench e2e``: the same launched CTR job with plain Paddle PS and with heterps, back to back.

Every run uses the same generated data, steps and seed; what is compared is samples/s (ratio
heterps/ps) and held-out AUC, against a single-process run without parameter servers as the learning
reference.  The heterps run plans itself (the example config: this machine, ``cluster: local``); the
bench reads its plan and reports the cost model's predicted samples/s for the launched processes next
to the measured ones.  The machine is shared and noisy: compare only figures from one run, and use
``--repeats`` (the variants of one model run interleaved, ps / heterps / single, repeat after repeat, so a
change in the machine's load hits them alike); figures are medians over the repeats, ratios medians of the
per-repeat ratios.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from typing import Any, Callable

from heterps_paddle.tools.jobs import JobSpec, run_job

MODELS = ("ctr_dnn", "wide_deep", "deepfm")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", action="append", choices=MODELS, help="model to run (repeatable; default: all three)"
    )
    parser.add_argument("--rows", type=int, default=200_000, help="generated training rows (default 200000)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--no-reference", action="store_true", help="skip the single-process reference run")
    parser.add_argument("--repeats", type=int, default=1, help="runs of each variant, interleaved (default 1)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per job")
    parser.add_argument(
        "--meter",
        action="store_true",
        help="instead: what measuring costs (docs/metrics.md): the heterps job with its trainers measuring (the "
        "default) and without (HETERPS_METER=0), interleaved; reports the ratio of their samples/s",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def plan_summary(plan_path: str, measured: float) -> dict[str, Any]:
    """The plan a heterps run made and the cost model's samples/s for it: the plan was fitted to the launched
    processes (planning/launch_fit.py), so its throughput is the prediction for this very launch."""
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    predicted = plan["throughput"]
    return {
        "stages": [(s["resource"], len(s["layers"]), s["units"]) for s in plan["stages"]],
        "predicted_samples_per_second": round(predicted, 1),
        "measured_over_predicted": round(measured / predicted, 3),
    }


def _median_run(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One variant's figures over the repeats: medians, with every repeat's value kept."""
    merged = dict(runs[0])
    for key in ("samples_per_second", "test_auc", "wall_seconds"):
        values = [r[key] for r in runs]
        merged[key] = round(statistics.median(values), 4 if key == "test_auc" else 1)
        if len(runs) > 1:
            merged[f"{key}_runs"] = values
    plans = [r["plan"] for r in runs if "plan" in r]
    if plans:
        merged["plan"] = dict(plans[0])
        ratios = [p["measured_over_predicted"] for p in plans if "measured_over_predicted" in p]
        if ratios:
            merged["plan"]["measured_over_predicted"] = round(statistics.median(ratios), 3)
            if len(ratios) > 1:
                merged["plan"]["measured_over_predicted_runs"] = ratios
    return merged


def _paired(runs: dict[str, list[dict[str, Any]]], key: str, combine: Callable[[Any, Any], float]) -> float:
    """Median over repeats of combine(heterps, reference) taken within each repeat."""
    return statistics.median(combine(h[key], p[key]) for h, p in zip(runs["heterps"], runs["ps"]))


def run(args: argparse.Namespace) -> int:
    if args.repeats < 1:
        raise SystemExit("bench e2e: --repeats must be at least 1")
    models = args.model or list(MODELS)
    overrides = {"generate_rows": args.rows, "epochs": args.epochs, "batch_size": args.batch_size}
    report: dict[str, Any] = {
        "benchmark": "e2e",
        "rows": args.rows,
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "workers": args.workers,
        "servers": args.servers,
        "repeats": args.repeats,
        "models": {},
    }
    for model in models:
        variants: list[tuple[str, dict[str, Any]]] = [("ps", dict(heterps=False)), ("heterps", dict(heterps=True))]
        if args.meter:  # the same heterps job measuring and not: the "ps" side of the ratio is the unmetered one
            variants = [("ps", dict(heterps=True, env={"HETERPS_METER": "0"})), ("heterps", dict(heterps=True))]
        elif not args.no_reference:
            variants.append(("single_process", dict(heterps=False, workers=0)))
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in variants}
        for repeat in range(args.repeats):
            for name, kind in variants:
                spec = JobSpec(
                    model=model,
                    servers=args.servers,
                    workers=kind.get("workers", args.workers),
                    heterps=kind["heterps"],
                    overrides=overrides,
                    timeout=args.timeout,
                    env=kind.get("env", {}),
                )
                print(f"bench e2e: {model} {name} ({repeat + 1}/{args.repeats}) ...", file=sys.stderr, flush=True)
                with tempfile.TemporaryDirectory(prefix=f"heterps-e2e-{model}-{name}-") as work_dir:
                    summary = run_job(spec, work_dir).summary()
                    plan_path = os.path.join(work_dir, "heterps_plan", "plan.json")
                    if spec.heterps and os.path.isfile(plan_path):
                        summary["plan"] = plan_summary(plan_path, summary["samples_per_second"])
                runs[name].append(summary)
        merged = {name: _median_run(values) for name, values in runs.items()}
        entry = {
            "runs": merged,
            "test_auc_vs_single_process": (
                round(merged["heterps"]["test_auc"] - merged["single_process"]["test_auc"], 4)
                if "single_process" in merged
                else None
            ),
            "samples_per_second_ratio": round(_paired(runs, "samples_per_second", lambda h, p: h / p), 3),
            "test_auc_difference": round(_paired(runs, "test_auc", lambda h, p: h - p), 4),
        }
        if args.meter:
            ratio = round(_paired(runs, "samples_per_second", lambda h, p: h / p), 3)  # metered / unmetered
            entry = {
                "metered": merged["heterps"],
                "unmetered": merged["ps"],
                "samples_per_second_ratio": ratio,
                "measuring_cost": round(1.0 - ratio, 4),
            }
        report["models"][model] = entry
    if args.json or args.meter:
        print(json.dumps(report))
    else:
        print(f"{'model':10} {'run':15} {'samples/s':>10} {'held-out AUC':>13} {'wall s':>7}")
        for model, entry in report["models"].items():
            for name, r in entry["runs"].items():
                print(
                    f"{model:10} {name:15} {r['samples_per_second']:>10.0f} {r['test_auc']:>13.4f} "
                    f"{r['wall_seconds']:>7.1f}"
                )
            print(
                f"{model:10} heterps/ps samples/s ratio {entry['samples_per_second_ratio']:.3f}, "
                f"AUC difference {entry['test_auc_difference']:+.4f}"
            )
            plan = entry["runs"]["heterps"].get("plan")
            if plan and "predicted_samples_per_second" in plan:
                print(
                    f"{model:10} plan {plan['stages']}: predicted {plan['predicted_samples_per_second']:.0f} "
                    f"samples/s for the launch, measured/predicted {plan['measured_over_predicted']:.3f}"
                )
    return 0
