"""``heterps bench e2e``: the same launched CTR job with plain Paddle PS and with heterps, back to back.

Every run uses the same generated data, steps and seed; what is compared is samples/s (ratio
heterps/ps) and held-out AUC, against a single-process run without parameter servers as the learning
reference.  The heterps run plans itself (the example config: this machine, ``cluster: local``); the
bench reads its plan and reports the cost model's predicted samples/s for the launched processes next
to the measured ones.  The machine is shared and noisy: compare only figures from one run.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile

MODELS = ("ctr_dnn", "wide_deep", "deepfm")


def add_arguments(parser) -> None:
    parser.add_argument("--model", action="append", choices=MODELS,
                        help="model to run (repeatable; default: all three)")
    parser.add_argument("--rows", type=int, default=200_000, help="generated training rows (default 200000)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--servers", type=int, default=1)
    parser.add_argument("--no-reference", action="store_true", help="skip the single-process reference run")
    parser.add_argument("--timeout", type=float, default=900, help="seconds allowed per job")
    parser.add_argument("--json", action="store_true", help="print one JSON object on stdout")


def plan_summary(plan_path: str, launched_workers: int, measured: float) -> dict:
    """The plan a heterps run made, and the cost model's samples/s for the processes actually launched
    (a one-stage plan runs data-parallel on every launched CPU trainer)."""
    with open(plan_path, encoding="utf-8") as f:
        plan = json.load(f)
    stages = plan["stages"]
    summary = {"stages": [(s["resource"], len(s["layers"]), s["units"]) for s in stages],
               "planned_samples_per_second": round(plan["throughput"], 1)}
    if len(stages) == 1:
        predicted = launched_workers / stages[0]["time_per_sample"]
        summary["predicted_samples_per_second"] = round(predicted, 1)
        summary["measured_over_predicted"] = round(measured / predicted, 3)
    return summary


def run(args) -> int:
    from ..jobs import JobSpec, run_job

    models = args.model or list(MODELS)
    overrides = {"generate_rows": args.rows, "epochs": args.epochs, "batch_size": args.batch_size}
    report = {"benchmark": "e2e", "rows": args.rows, "epochs": args.epochs, "batch_size": args.batch_size,
              "workers": args.workers, "servers": args.servers, "models": {}}
    for model in models:
        runs = {}
        variants = [("ps", dict(heterps=False)), ("heterps", dict(heterps=True))]
        if not args.no_reference:
            variants.append(("single_process", dict(heterps=False, workers=0)))
        for name, kind in variants:
            spec = JobSpec(model=model, servers=args.servers, workers=kind.get("workers", args.workers),
                           heterps=kind["heterps"], overrides=overrides, timeout=args.timeout)
            print(f"bench e2e: {model} {name} ...", file=sys.stderr, flush=True)
            with tempfile.TemporaryDirectory(prefix=f"heterps-e2e-{model}-{name}-") as work_dir:
                runs[name] = run_job(spec, work_dir).summary()
                plan_path = os.path.join(work_dir, "heterps_plan", "plan.json")
                if spec.heterps and os.path.isfile(plan_path):
                    runs[name]["plan"] = plan_summary(plan_path, spec.workers, runs[name]["samples_per_second"])
        entry = {"runs": runs,
                 "test_auc_vs_single_process": (round(runs["heterps"]["test_auc"]
                                                      - runs["single_process"]["test_auc"], 4)
                                                if "single_process" in runs else None),
                 "samples_per_second_ratio": round(runs["heterps"]["samples_per_second"]
                                                   / runs["ps"]["samples_per_second"], 3),
                 "test_auc_difference": round(runs["heterps"]["test_auc"] - runs["ps"]["test_auc"], 4)}
        report["models"][model] = entry
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'model':10} {'run':15} {'samples/s':>10} {'held-out AUC':>13} {'wall s':>7}")
        for model, entry in report["models"].items():
            for name, r in entry["runs"].items():
                print(f"{model:10} {name:15} {r['samples_per_second']:>10.0f} {r['test_auc']:>13.4f} "
                      f"{r['wall_seconds']:>7.1f}")
            print(f"{model:10} heterps/ps samples/s ratio {entry['samples_per_second_ratio']:.3f}, "
                  f"AUC difference {entry['test_auc_difference']:+.4f}")
            plan = entry["runs"]["heterps"].get("plan")
            if plan and "predicted_samples_per_second" in plan:
                print(f"{model:10} plan {plan['stages']}: predicted {plan['predicted_samples_per_second']:.0f} "
                      f"samples/s for the launch, measured/predicted {plan['measured_over_predicted']:.3f}")
    return 0
